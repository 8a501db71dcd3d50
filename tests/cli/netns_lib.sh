# Hosts as Linux network namespaces, for the multi-host tests (sourced).
#
# netns_up NAME HOSTS OCTET makes HOSTS "hosts" ${NAME}h0, ${NAME}h1, ...,
# each a network namespace with one interface eth0 at 10.OCTET.0.(i+1)/24,
# cabled to a bridge in a switch namespace ${NAME}sw (port p$i). Nothing
# gets an address outside 10.OCTET.0.0/24 and the host's own namespace is
# untouched. netns_mpirun runs mpirun on ${NAME}h0 with Open MPI forced onto
# TCP over that subnet; it reaches each host's orted through netns_agent.sh,
# as it would through ssh. The namespaces share the process table and the
# file system, which real hosts do not: the tests never reach across them
# (no kill of a process on another host, no file one rank writes for
# another), except here, to count and tear down what is left.
#
# The caller sets `name` and `octet` (its own, unique among the tests) and
# calls netns_require first: it exits 77 (ctest's skip) where namespaces
# cannot be made.

netns_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

netns_require() {
  local probe="cfprobe$$"
  if ! command -v ip > /dev/null; then
    echo "SKIP: no ip (iproute2): the multi-host tests need network namespaces"
    exit 77
  fi
  if ! command -v ping > /dev/null; then
    echo "SKIP: no ping (iputils-ping): netns_agent.sh pings a host before reaching it, as ssh would"
    exit 77
  fi
  if ! ip netns add "$probe" 2> /dev/null; then
    echo "SKIP: cannot make a network namespace here (ip netns add needs root, or CAP_SYS_ADMIN)"
    exit 77
  fi
  ip netns del "$probe"
}

# netns_up NAME HOSTS OCTET
netns_up() {
  local n=$1 hosts=$2 octet=$3 i
  netns_down "$n"  # the leftovers of a killed earlier run of the same test
  ip netns add "${n}sw"
  ip -n "${n}sw" link add br0 type bridge
  ip -n "${n}sw" link set br0 up
  for ((i = 0; i < hosts; ++i)); do
    ip netns add "${n}h$i"
    ip -n "${n}sw" link add "p$i" type veth peer name eth0 netns "${n}h$i"
    ip -n "${n}sw" link set "p$i" master br0 up
    ip -n "${n}h$i" addr add "10.$octet.0.$((i + 1))/24" dev eth0
    ip -n "${n}h$i" link set eth0 up
    ip -n "${n}h$i" link set lo up
  done
}

# netns_pids NS: the processes in namespace NS, one per line.
netns_pids() { ip netns pids "$1" 2> /dev/null; }

# netns_down NAME: kills what is left in NAME's namespaces and deletes them.
netns_down() {
  local ns
  for ns in $(ip netns list | awk -v p="^$1(h[0-9]+|sw)$" '$1 ~ p { print $1 }'); do
    netns_pids "$ns" | xargs -r kill -9 2> /dev/null
    ip netns del "$ns" 2> /dev/null
  done
  rm -rf "/tmp/$1-hosts"
  return 0
}

# netns_cable NAME HOST up|down: plugs host HOST's cable in or pulls it out
# (its switch port goes down: both directions stop, and the host sees no
# link event of its own, as when a cable is cut somewhere along the way).
netns_cable() { ip -n "$1sw" link set "p$2" "$3"; }

# netns_mpirun NAME HOSTS_SPEC MPIRUN_ARGS...: mpirun on ${NAME}h0 with its
# ranks on the hosts of HOSTS_SPEC (mpirun's --host, e.g. "${name}h0:1,${name}h1:1"),
# over TCP on the namespaces' subnet only.
# With NETNS_EXEC=1 the shell becomes that mpirun (exec), as a `cnnflow
# launch --mpirun` script must, so that the launcher's child is mpirun.
netns_mpirun() {
  local n=$1 spec=$2 subnet
  shift 2
  subnet=$(ip -n "${n}h0" -4 -o addr show dev eth0 | awk '{ sub(/\.[0-9]+\/24$/, ".0/24", $4); print $4 }')
  mkdir -p "/tmp/${n}-hosts"
  local cmd=(ip netns exec "${n}h0" "$mpiexec" --host "$spec" --oversubscribe
    --mca plm_rsh_agent "$netns_dir/netns_agent.sh"
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$subnet"
    --mca oob_tcp_if_include "$subnet" "$@")
  if [[ ${NETNS_EXEC:-0} == 1 ]]; then
    NETNS_TMP="/tmp/${n}-hosts" exec "${cmd[@]}"
  fi
  NETNS_TMP="/tmp/${n}-hosts" "${cmd[@]}"
}
