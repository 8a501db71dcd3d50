#include "tools/launch_job.h"

#include <gtest/gtest.h>

#include "ops/error.h"

namespace cnnflow {
namespace {

using Args = std::vector<std::string>;

TEST(LaunchJob, FindsTheTrainCommandAndItsRunFolder) {
  const Job job = ParseJob({"mpirun", "-x", "A", "/b/cnnflow", "train", "c.yaml", "--out", "r"});
  EXPECT_EQ(job.train, 4u);
  EXPECT_EQ(job.run_dir, "r");
  EXPECT_EQ(JobCommand(job, true),
            (Args{"mpirun", "-x", "A", "/b/cnnflow", "train", "c.yaml", "--resume", "r"}));
  EXPECT_EQ(JobCommand(job, false), job.command);
  EXPECT_THROW(ParseJob({"cnnflow", "train", "c.yaml"}), ConfigError);
  EXPECT_THROW(ParseJob({"python", "train.py", "--out", "r"}), ConfigError);
}

TEST(LaunchJob, LayoutTakesProcsPerHostElseSlotsElseOne) {
  const std::vector<Host> hosts = {{"a", 0}, {"b", 4}};
  const Layout slots = MakeLayout(hosts, 0);
  EXPECT_EQ(slots.procs, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(slots.Describe(), "2 hosts (a,b; 5 processes)");
  EXPECT_EQ(MakeLayout(hosts, 2).Processes(), 4);
  EXPECT_EQ(MakeLayout({{"a", 0}}, 0).Describe(), "1 host (a; 1 process)");
}

TEST(LaunchJob, MpirunLineGoesBeforeTrainOrIntoTheUsersMpirun) {
  const Layout layout = MakeLayout({{"h0", 0}, {"h1", 0}, {"h2", 0}}, 2);
  const Args train = {"cnnflow", "train", "c.yaml", "--out", "r"};
  EXPECT_EQ(MpirunLine(train, 1, "/opt/mpirun", layout),
            (Args{"/opt/mpirun", "--host", "h0:2,h1:2,h2:2", "-n", "6", "cnnflow", "train",
                  "c.yaml", "--out", "r"}));
  const Args own = {"mpiexec", "--mca", "btl", "tcp,self", "cnnflow", "train", "c.yaml"};
  EXPECT_EQ(MpirunLine(own, 5, "unused", layout),
            (Args{"mpiexec", "--host", "h0:2,h1:2,h2:2", "-n", "6", "--mca", "btl", "tcp,self",
                  "cnnflow", "train", "c.yaml"}));
}

TEST(LaunchJob, ElasticCommandMayNotChooseItsHosts) {
  EXPECT_NO_THROW(CheckElasticCommand({"cnnflow", "train", "c.yaml"}, 1));
  EXPECT_NO_THROW(CheckElasticCommand({"mpirun", "-x", "A", "cnnflow", "train"}, 4));
  EXPECT_THROW(CheckElasticCommand({"srun", "cnnflow", "train"}, 2), ConfigError);
  for (const char* chosen : {"-n", "-np", "--host", "-H", "--hostfile"}) {
    EXPECT_THROW(CheckElasticCommand({"mpirun", chosen, "4", "cnnflow", "train"}, 4), ConfigError)
        << chosen;
  }
  EXPECT_THROW(CheckElasticCommand({"mpirun", "--host=a,b", "cnnflow", "train"}, 3), ConfigError);
}

TEST(LaunchJob, AgentIsTheFlagsElseMpirunsElseTheEnvironmentsElseSsh) {
  const Args plain = {"cnnflow", "train"};
  EXPECT_EQ(RemoteAgent("", plain, 1, nullptr), (Args{"ssh", "-o", "BatchMode=yes"}));
  EXPECT_EQ(RemoteAgent("/t/agent.sh -v", plain, 1, "rsh"), (Args{"/t/agent.sh", "-v"}));
  const Args mca = {"mpirun", "--mca", "plm_rsh_agent", "/t/a.sh", "cnnflow", "train"};
  EXPECT_EQ(RemoteAgent("", mca, 5, "rsh"), (Args{"/t/a.sh"}));
  EXPECT_EQ(RemoteAgent("", plain, 1, "ssh -p 2222 : rsh"),
            (Args{"ssh", "-o", "BatchMode=yes", "-p", "2222"}));
  // The train command's own arguments are not mpirun's.
  const Args late = {"cnnflow", "train", "--mca", "plm_rsh_agent", "x"};
  EXPECT_EQ(RemoteAgent("", late, 1, nullptr)[0], "ssh");
}

}  // namespace
}  // namespace cnnflow
