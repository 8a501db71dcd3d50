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
host=$1
shift
mkdir -p "$NETNS_TMP/$host"
if [ "$(stat -L -c %i "/run/netns/$host")" != "$(stat -L -c %i /proc/self/ns/net)" ]; then
  unset CNNFLOW_LAUNCH_NOTIFY
fi
exec ip netns exec "$host" env TMPDIR="$NETNS_TMP/$host" sh -c "$*"
