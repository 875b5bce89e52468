"""The KServe v2 gRPC front end: ``inference.GRPCInferenceService`` on its own port.

Inference (``ModelInfer`` and each request of a ``ModelStreamInfer`` stream) goes through the
same scheduler and dispatch loop as HTTP; every other RPC passes through to Triton's gRPC as
bytes. Named ``grpc_frontend``, not ``grpc``, so that it never shadows the ``grpc`` package.
"""
