// Stages: the node kinds of a training graph, and their registry.
//
// How to add a stage type (one .cc in stages/, one CMake line):
//   1. stages/<name>.cc: a class deriving from Stage whose Build() adds its
//      oneTBB node(s) to the graph and returns the ports to connect.
//   2. At the bottom: CNNFLOW_REGISTER_STAGE(name, Class, Schema("doc")...);
//      the schema is the single source of its YAML documentation
//      (`cnnflow stages` prints it). Class's constructor takes
//      (const StageInfo&, const Args&).
// A stage never includes another stage; what they share is in this folder's
// message.h, run_context.h and pass_state.h.
#pragma once

#include <tbb/flow_graph.h>  // costly to compile: include this header only where nodes are built

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/schema.h"
#include "stages/graph_plan.h"
#include "stages/message.h"

namespace cnnflow {

struct RunContext;
struct PassState;
using FlowGraph = tbb::flow::graph;
using MessageReceiver = tbb::flow::receiver<Message>;
using MessageSender = tbb::flow::sender<Message>;

// An error thrown inside a node, with the node's name attached.
class StageError : public Error {
 public:
  using Error::Error;
};

struct StageInfo {
  std::string node;  // the node's name in the graph YAML
  std::string type;  // the stage type
};

// The connectable ends of a built stage. A source has no input; a sink's
// output may be left unconnected. A limiter (prefetch) gets Release() once
// per message that leaves the graph.
//
// A per-device stage (forward_backward, pipeline_stage, allreduce,
// optimizer, ema) is one node per device, a lane each: lane r is replica
// (or pipeline stage) r's, and carries each batch once. An edge between two
// per-device stages joins lane r to lane r. Lanes never meet plain ports
// directly (every lane would carry every batch): forward_backward and
// pipeline_stage take a plain input and start the lanes, and a
// stage that may end them offers a gather (stages/lanes.h): its
// gather_inputs, one per lane, and `output`. An edge from such a stage to a
// plain node goes through the gather.
struct StagePorts {
  MessageReceiver* input = nullptr;
  MessageSender* output = nullptr;
  std::vector<MessageReceiver*> lane_inputs;
  std::vector<MessageSender*> lane_outputs;
  std::vector<MessageReceiver*> gather_inputs;
  bool is_limiter = false;
  std::function<void()> activate;  // sources: start producing
};

// The ports of a stage that is one node, both receiver and sender.
template <typename Node>
StagePorts PortsOf(Node& node) {
  StagePorts p;
  p.input = &node;
  p.output = &node;
  return p;
}

class Stage {
 public:
  explicit Stage(StageInfo info) : info_(std::move(info)) {}
  virtual ~Stage() = default;
  const StageInfo& info() const { return info_; }
  // Adds the stage's node(s) to `graph`, for the pass `pass` of the run
  // `run`; both outlive the graph.
  virtual StagePorts Build(FlowGraph& graph, const RunContext& run, PassState& pass) = 0;
  // For limiters: gives back one token (called when a message leaves the graph).
  virtual void Release() {}

 protected:
  // Runs fn, attaching the node's name to any exception it throws.
  template <typename Fn>
  auto Guarded(Fn&& fn) const -> decltype(fn()) {
    try {
      return fn();
    } catch (const StageError&) {
      throw;
    } catch (const std::exception& e) {
      throw StageError("node '" + info_.node + "' (" + info_.type + "): " + e.what());
    }
  }

 private:
  StageInfo info_;
};

using StageFactory = std::function<std::unique_ptr<Stage>(const StageInfo&, const Args&)>;

// How a stage's nodes stand in the graph.
enum class StageLayout {
  kOne,             // one node
  kPerDevice,       // one node per device, a lane each (see StagePorts)
  kPerDeviceChain,  // per device, each also messaging its neighbours
                    // (pipeline stages: activations on, gradients back)
};

struct StageType {
  static constexpr const char* kKind = "stage type";
  Schema schema;
  StageFactory create;
  StageLayout layout = StageLayout::kOne;
  bool per_device() const { return layout != StageLayout::kOne; }
};
using StageRegistry = Registry<StageType>;

#define CNNFLOW_REGISTER_STAGE(type_name, Class, schema_expr)                                 \
  static ::cnnflow::RegisterIn<::cnnflow::StageType> cnnflow_stage_registration_##type_name(  \
      #type_name, {schema_expr, [](const ::cnnflow::StageInfo& i, const ::cnnflow::Args& a) { \
                     return std::unique_ptr<::cnnflow::Stage>(new Class(i, a));               \
                   }})

// A stage of one node per device (StagePorts' lanes); `layout` is
// kPerDevice or kPerDeviceChain.
#define CNNFLOW_REGISTER_PER_DEVICE_STAGE(type_name, Class, schema_expr, layout)             \
  static ::cnnflow::RegisterIn<::cnnflow::StageType> cnnflow_stage_registration_##type_name( \
      #type_name, {schema_expr,                                                              \
                   [](const ::cnnflow::StageInfo& i, const ::cnnflow::Args& a) {             \
                     return std::unique_ptr<::cnnflow::Stage>(new Class(i, a));              \
                   },                                                                        \
                   ::cnnflow::StageLayout::layout})

}  // namespace cnnflow
