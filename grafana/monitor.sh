#!/usr/bin/env bash
# Run a local Prometheus scraping a running sidecar (and Triton's and DCGM's metrics if given),
# with the recording rules the dashboards use. Usage:
#   grafana/monitor.sh [SIDECAR host:port] [TRITON_METRICS host:port] [DCGM host:port] [PORT]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
sidecar="${1:-${SIDECAR:-localhost:8000}}"
triton="${2:-${TRITON_METRICS:-localhost:8002}}"
dcgm="${3:-${DCGM:-localhost:9400}}"
port="${4:-${PROMETHEUS_PORT:-9090}}"
out="${MONITOR_DIR:-$PWD/out/monitor}"
mkdir -p "$out/data"
cp "$here/prometheus/rules.yml" "$out/rules.yml"
sed -e "s/\"localhost:8000\"/\"$sidecar\"/" -e "s/\"localhost:8002\"/\"$triton\"/" \
    -e "s/\"localhost:9400\"/\"$dcgm\"/" "$here/prometheus/prometheus.yml" > "$out/prometheus.yml"
promtool check config "$out/prometheus.yml" >/dev/null
cat <<MSG
Prometheus on http://127.0.0.1:$port scraping the sidecar at $sidecar (Triton $triton, DCGM $dcgm).
Grafana: provision it with this repository's grafana/provisioning (set PROMETHEUS_URL=http://<this host>:$port
and GRAFANA_DASHBOARDS_DIR=$here/dashboards), or add http://<this host>:$port as a Prometheus data source
with uid "prometheus" and import grafana/dashboards/overview.json and tenants.json.
Ctrl-C stops it.
MSG
exec prometheus --config.file="$out/prometheus.yml" --storage.tsdb.path="$out/data" \
    --web.listen-address="127.0.0.1:$port" --log.level=warn
