"""The device layer's exception family: one base class, one subclass per thing a user can fix."""

from __future__ import annotations


class DeviceError(Exception):
    """Base of every error the device layer raises; vendor errors never leave this package."""


class NoDeviceError(DeviceError):
    """No GPU (or no driver, or no NVML library) where one was asked for."""


class DevicePermissionError(DeviceError):
    """The operation needs privileges the process lacks (clock locking needs root/CAP_SYS_ADMIN)."""


class DeviceNotSupportedError(DeviceError):
    """The GPU or its driver does not support the operation (e.g. locked clocks on old GPUs)."""


class InvalidClockError(DeviceError, ValueError):
    """A clock that is not in the device's supported ladder."""


class DeviceLostError(DeviceError):
    """The GPU fell off the bus or needs a reset."""
