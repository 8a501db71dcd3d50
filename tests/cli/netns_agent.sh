#!/bin/sh
# Open MPI's plm_rsh_agent for the namespace hosts of netns_lib.sh: what ssh
# does for a real host. mpirun calls it as `netns_agent.sh HOST COMMAND...`
# and HOST is the namespace's name. Each host gets a temporary directory of
# its own (under $NETNS_TMP), as separate machines have: Open MPI's session
# files are named by the hostname, which the namespaces share, and two
# orteds writing the same hwloc topology file crash (1 start in 4 here).
# The FIFO of a `cnnflow launch` ($CNNFLOW_LAUNCH_NOTIFY) is on the
# launcher's host, the one mpirun runs on: a rank of another host cannot
# reach it (ssh does not pass the variable, and a FIFO is host-local), so
# the variable goes to mpirun's own namespace only.
# Like ssh, it fails (exit 255, ssh's message) for a host that the caller's
# namespace cannot reach: one ping of the host's eth0 address. `ip netns
# exec` alone would reach a host whose link is down, or whose cable is cut.
host=$1
shift
if [ ! -e "/run/netns/$host" ]; then
  echo "ssh: Could not resolve hostname $host: Name or service not known" >&2
  exit 255
fi
if [ "$(stat -L -c %i "/run/netns/$host")" != "$(stat -L -c %i /proc/self/ns/net)" ]; then
  unset CNNFLOW_LAUNCH_NOTIFY
  addr=$(ip -n "$host" -4 -o addr show dev eth0 2> /dev/null | awk '{ sub(/\/.*/, "", $4); print $4 }')
  if [ -z "$addr" ] || ! ping -c1 -W1 "$addr" > /dev/null 2>&1; then
    echo "ssh: connect to host $host port 22: No route to host" >&2
    exit 255
  fi
fi
: "${NETNS_TMP:=/tmp/netns-agent}"
mkdir -p "$NETNS_TMP/$host"
exec ip netns exec "$host" env TMPDIR="$NETNS_TMP/$host" sh -c "$*"
