#!/usr/bin/env bash
# Install (once) Debian's prometheus and promtool for the sidecar's tests: tests/integration/
# test_sidecar_prometheus.py starts a Prometheus of its own on loopback that scrapes `hangwatch watch`
# and evaluates docs/alerts/hangwatch-rules.yml, and `promtool test rules` checks those rules. Idempotent:
# returns at once when both programs are there; without root or apt-get it says so and the tests skip.
#
#   scripts/setup-prometheus.sh        (make prometheus-deps)
#
# No daemon is started: the package's init script would start one on :9090, so policy-rc.d refuses every
# start during the install (a temporary one, written only when the machine has none), and the unit the
# package enables for the next boot is disabled. The test's server reads only its own configuration.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  echo "prometheus: installed ($(dpkg-query -W -f '${Version}' prometheus 2>/dev/null || echo 'not from apt'))"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "prometheus: not installed and cannot install (needs root and apt-get): its tests will be skipped"
  exit 0
fi

policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# hangwatch scripts/setup-prometheus.sh: no service starts during the install\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi

start=$(date +%s.%N)
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends prometheus >/dev/null ||
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } ||
  { echo "prometheus: apt-get install failed: its tests will be skipped"; exit 0; }
end=$(date +%s.%N)
if command -v systemctl >/dev/null 2>&1; then
  systemctl disable --quiet prometheus.service >/dev/null 2>&1 || true
else
  rm -f /etc/systemd/system/multi-user.target.wants/prometheus.service
  update-rc.d prometheus disable >/dev/null 2>&1 || true
fi
echo "prometheus: installed $(dpkg-query -W -f '${Version}' prometheus) in $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s"
