// Registry<T> (ops/registry.h): what every registered kind relies on.
#include "ops/registry.h"

#include <gtest/gtest.h>

#include <string>

namespace cnnflow {
namespace {

struct Widget {
  static constexpr const char* kKind = "widget type";
  int value = 0;
};

TEST(Registry, FindsBaseEntriesAndVariantsByPriority) {
  Registry<Widget>& r = Registry<Widget>::Get();
  r.Register("conv", {1});
  r.Register("conv", {2}, kCudaVariant);
  r.Register("relu", {3});
  r.Register("gpu_only", {4}, kCudaVariant);
  EXPECT_EQ(r.Find("conv")->value, 1);
  EXPECT_EQ(r.Find("conv", kCudaVariant)->value, 2);
  EXPECT_EQ(r.Find("relu", kCudaVariant), nullptr);
  EXPECT_EQ(r.Find("nope"), nullptr);
  EXPECT_EQ(r.Get("relu").value, 3);
  // Names: the keys with a base entry, sorted.
  EXPECT_EQ(r.Names(), (std::vector<std::string>{"conv", "relu"}));
  EXPECT_EQ(&Registry<Widget>::Get(), &r);  // one table per kind
}

TEST(Registry, ANameTwiceAtOnePriorityIsAnError) {
  Registry<Widget>& r = Registry<Widget>::Get();
  r.Register("pool", {1});
  try {
    r.Register("pool", {2});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("widget type 'pool' registered twice"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(r.Find("pool")->value, 1);
}

TEST(Registry, AnUnknownNameSaysTheClosestAndTheKnownOnes) {
  Registry<Widget>& r = Registry<Widget>::Get();
  r.Register("batchnorm", {1});
  try {
    r.Get("batchnrom");
    FAIL();
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("unknown widget type 'batchnrom' (did you mean 'batchnorm'?); known: ", 0),
              0u)
        << msg;
    EXPECT_NE(msg.find("batchnorm"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace cnnflow
