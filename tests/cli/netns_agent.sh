#!/bin/sh
# Open MPI's plm_rsh_agent for the namespace hosts of netns_lib.sh: what ssh
# does for a real host. mpirun calls it as `netns_agent.sh HOST COMMAND...`
# and HOST is the namespace's name.
host=$1
shift
exec ip netns exec "$host" sh -c "$*"
