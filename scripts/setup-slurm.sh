#!/usr/bin/env bash
# Install (once) Debian's Slurm daemons, clients and munge for tests/integration/test_nodes_slurm_real.py,
# which starts a cluster of its own on emulated nodes (tests/slurm_cluster.py). Idempotent: returns at once
# when the programs are there; without root or apt-get it says so and the test skips with the reason.
#
#   scripts/setup-slurm.sh        (make slurm-deps)
#
# Measured on the 2-core CI-class machine, 2026-12-02: 8.7-13.0 s for the 8 packages (slurmctld, slurmd,
# slurm-client, slurm-wlm-basic-plugins, munge, libmunge2, libhwloc15, liblua5.1-0), download included.
# No daemon is started: policy-rc.d refuses every start during the install (a temporary one is written
# only when the machine has none), and the units the packages enable for the next boot are disabled; the
# test's daemons read only their own configuration (SLURM_CONF, munged --socket/--key-file), never /etc.
set -euo pipefail

have() {
  [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/slurmstepd ] &&
    [ -x /usr/sbin/munged ] && command -v srun >/dev/null 2>&1 && command -v mungekey >/dev/null 2>&1
}

if have; then
  echo "slurm: installed (slurm-client $(dpkg-query -W -f '${Version}' slurm-client))"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "slurm: not installed and cannot install (needs root and apt-get): the real-Slurm test will be skipped"
  exit 0
fi

policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# hangwatch scripts/setup-slurm.sh: no service starts during the install\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi

start=$(date +%s.%N)
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null ||
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null; } ||
  { echo "slurm: apt-get install failed: the real-Slurm test will be skipped"; exit 0; }
end=$(date +%s.%N)
# The packages enable their units for the next boot (multi-user.target.wants): the tests start daemons of
# their own, so these stay off; only the three units this install enabled are disabled, and only here.
if command -v systemctl >/dev/null 2>&1; then
  systemctl disable --quiet munge.service slurmd.service slurmctld.service >/dev/null 2>&1 || true
else
  rm -f /etc/systemd/system/multi-user.target.wants/{munge,slurmd,slurmctld}.service
  for unit in munge slurmd slurmctld; do update-rc.d "$unit" disable >/dev/null 2>&1 || true; done
fi
echo "slurm: installed slurm-client $(dpkg-query -W -f '${Version}' slurm-client) in $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s"
