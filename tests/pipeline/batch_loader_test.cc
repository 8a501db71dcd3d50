// The loader graph behind an iterator (cnnflow.Loader's core): the same
// batches whatever the threads and prefetch, every sample once in order
// without shuffling, held batches left intact, bad records failing with the
// node's name or skipped and listed, and an epoch ended early joining its
// thread.
#include "pipeline/batch_loader.h"

#include <gtest/gtest.h>

#include <cstring>

#include "loaders/synthetic_dataset.h"

namespace cnnflow {
namespace {

// Synthetic samples, record `bad` unreadable.
class WithBadRecord : public SyntheticDataset {
 public:
  WithBadRecord(SyntheticOptions o, int64_t bad) : SyntheticDataset(std::move(o)), bad_(bad) {}
  ReadResult Read(int64_t index, const ReadContext& ctx, float* dst) const override {
    if (index == bad_) return ReadResult{-1, "truncated"};
    return SyntheticDataset::Read(index, ctx, dst);
  }

 private:
  int64_t bad_;
};

std::shared_ptr<SyntheticDataset> Data(int64_t bad = -1) {
  SyntheticOptions o;
  o.shape = {2, 3, 3};
  o.size = 100;
  return bad < 0 ? std::make_shared<SyntheticDataset>(o) : std::make_shared<WithBadRecord>(o, bad);
}

struct Epoch {
  std::vector<std::vector<float>> inputs;
  std::vector<std::vector<int64_t>> labels;
};

Epoch Load(const BatchLoader& loader, int64_t epoch) {
  Epoch e;
  auto it = loader.Start(epoch);
  for (LoadedBatch b; it->Next(b);) {
    const float* x = b.inputs.data<float>();
    e.inputs.emplace_back(x, x + b.inputs.numel());
    e.labels.push_back(b.labels);
  }
  return e;
}

BatchLoaderOptions Options(int64_t threads, int64_t prefetch) {
  BatchLoaderOptions o;
  o.batch = 7;
  o.seed = 3;
  o.threads = threads;
  o.prefetch = prefetch;
  return o;
}

TEST(BatchLoader, SameBatchesWhateverTheThreadsAndPrefetch) {
  const BatchLoader one(Data(), {}, Options(1, 1));
  const BatchLoader four(Data(), {}, Options(4, 3));
  EXPECT_EQ(one.size(), 15);  // ceil(100 / 7)
  const Epoch a = Load(one, 2), b = Load(four, 2);
  ASSERT_EQ(a.labels.size(), 15u);
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(Load(one, 3).labels, a.labels);  // another epoch, another order
}

TEST(BatchLoader, UnshuffledEveryLabelInOrder) {
  BatchLoaderOptions o = Options(2, 2);
  o.shuffle = false;
  const auto data = Data();
  const Epoch e = Load(BatchLoader(data, {}, o), 0);
  std::vector<int64_t> labels;
  for (const auto& l : e.labels) labels.insert(labels.end(), l.begin(), l.end());
  ASSERT_EQ(labels.size(), 100u);
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(labels[i], data->Label(i)) << i;
}

TEST(BatchLoader, HeldBatchesStayIntact) {
  const BatchLoader loader(Data(), {}, Options(2, 1));
  auto it = loader.Start(0);
  LoadedBatch first;
  ASSERT_TRUE(it->Next(first));
  const std::vector<float> copy(first.inputs.data<float>(),
                                first.inputs.data<float>() + first.inputs.numel());
  for (LoadedBatch b; it->Next(b);) EXPECT_NE(b.inputs.data<float>(), first.inputs.data<float>());
  EXPECT_EQ(0, std::memcmp(copy.data(), first.inputs.data<float>(), copy.size() * sizeof(float)));
}

TEST(BatchLoader, BadRecordFailsNamingTheNodeOrIsSkipped) {
  const BatchLoader failing(Data(13), {}, Options(2, 2));
  try {
    Load(failing, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 'load' (load_batch): bad record #13"),
              std::string::npos)
        << e.what();
  }
  BatchLoaderOptions o = Options(2, 2);
  o.on_bad_record = "skip";
  const BatchLoader skipping(Data(13), {}, o);
  auto it = skipping.Start(0);
  int64_t samples = 0;
  for (LoadedBatch b; it->Next(b);) samples += static_cast<int64_t>(b.labels.size());
  EXPECT_EQ(samples, 99);
  ASSERT_EQ(it->bad_records().size(), 1u);
  EXPECT_NE(it->bad_records()[0].find("truncated"), std::string::npos);
}

TEST(BatchLoader, EndingAnEpochEarlyJoinsItsThread) {
  const BatchLoader loader(Data(), {}, Options(2, 1));
  for (int i = 0; i < 20; ++i) {
    auto it = loader.Start(i);
    LoadedBatch b;
    ASSERT_TRUE(it->Next(b));
  }  // each destroyed with batches still coming: must not hang
}

TEST(BatchLoader, OptionsAreChecked) {
  BatchLoaderOptions o = Options(1, 1);
  o.batch = 0;
  EXPECT_THROW(BatchLoader(Data(), {}, o), ConfigError);
  o = Options(1, 0);
  EXPECT_THROW(BatchLoader(Data(), {}, o), ConfigError);
  o = Options(1, 1);
  o.rank = 2;
  o.world = 2;
  EXPECT_THROW(BatchLoader(Data(), {}, o), ConfigError);
}

}  // namespace
}  // namespace cnnflow
