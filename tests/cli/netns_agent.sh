#!/bin/sh
# Open MPI's plm_rsh_agent for the namespace hosts of netns_lib.sh: what ssh
# does for a real host. mpirun calls it as `netns_agent.sh HOST COMMAND...`
# and HOST is the namespace's name. Each host gets a temporary directory of
# its own (under $NETNS_TMP), as separate machines have: Open MPI's session
# files are named by the hostname, which the namespaces share, and two
# orteds writing the same hwloc topology file crash (1 start in 4 here).
host=$1
shift
mkdir -p "$NETNS_TMP/$host"
exec ip netns exec "$host" env TMPDIR="$NETNS_TMP/$host" sh -c "$*"
