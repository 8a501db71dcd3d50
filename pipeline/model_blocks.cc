#include "pipeline/model_blocks.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <set>

#include "ops/layer.h"
#include "pipeline/block_expression.h"
#include "pipeline/model_library_data.h"

namespace cnnflow {
namespace {

using blocks::Bind;
using blocks::Env;
using blocks::Evaluate;
using blocks::FromNode;
using blocks::IsBareParam;
using blocks::ToNode;
using blocks::Value;

// Keys of a layer item that are not its type.
const std::set<std::string>& LayerKeys() {
  static const std::set<std::string> k = {"name", "inputs", "if", "trainable", "init"};
  return k;
}
const std::set<std::string>& BlockUseKeys() {
  static const std::set<std::string> k = {"name", "inputs", "if",    "block",
                                          "with", "repeat", "start", "first"};
  return k;
}
const std::vector<std::string>& InitSchemes() {
  static const std::vector<std::string> s = {
      "default", "zeros", "ones", "dirac", "kaiming_normal_fan_out", "whiten", "dirac_first"};
  return s;
}

// ------------------------------------------------------------ expansion

struct BlockDef {
  const YamlDoc* doc;
  YAML::Node node;  // the definition: {params: {...}, layers: [...], doc: "..."}
  std::string name;
};

struct LibraryEntry {
  const YamlDoc* doc;
  YAML::Node node;  // {block: b, with: {...}, input: [...], doc: "..."}
  std::string name;
};

// The library files, parsed once.
struct Library {
  std::vector<std::unique_ptr<YamlDoc>> docs;
  std::map<std::string, BlockDef> blocks;
  std::vector<LibraryEntry> models;

  static const Library& Get() {
    static const Library* lib = [] {
      auto* l = new Library();
      for (const auto& [file, text] : ModelLibraryFiles()) {
        l->docs.push_back(std::make_unique<YamlDoc>(YamlDoc::Parse(text, file)));
        const YamlDoc& d = *l->docs.back();
        const YAML::Node blocks = d.root()["blocks"];
        if (blocks && blocks.IsMap()) {
          for (const auto& kv : blocks) {
            const std::string n = d.Name(kv.first, "blocks");
            if (l->blocks.count(n))
              d.Fail(kv.first, "blocks", StrCat("block '", n, "' defined twice in the library"));
            l->blocks.emplace(n, BlockDef{&d, kv.second, n});
          }
        }
        const YAML::Node models = d.root()["models"];
        if (models && models.IsMap()) {
          for (const auto& kv : models)
            l->models.push_back({&d, kv.second, d.Name(kv.first, "models")});
        }
      }
      return l;
    }();
    return *lib;
  }
  const LibraryEntry* Find(const std::string& name) const {
    for (const auto& m : models)
      if (m.name == name) return &m;
    return nullptr;
  }
  std::vector<std::string> Names() const {
    std::vector<std::string> n;
    for (const auto& m : models) n.push_back(m.name);
    return n;
  }
};

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

class Expander {
 public:
  explicit Expander(const YamlDoc& doc) : doc_(doc) { blocks_ = Library::Get().blocks; }

  void AddBlocks(const YAML::Node& blocks) {
    if (!blocks) return;
    if (!blocks.IsMap())
      doc_.Fail(blocks, "model.blocks", "expected {name: {params: {...}, layers: [...]}}");
    for (const auto& kv : blocks) {
      const std::string n = doc_.Name(kv.first, "model.blocks");
      // The config's own blocks shadow the library's (erase, not assign: a
      // YAML::Node assigned to writes into the node it refers to).
      blocks_.erase(n);
      blocks_.emplace(n, BlockDef{&doc_, kv.second, n});
    }
  }

  // Expands a list of items with `env` in scope under `prefix`; `input` is
  // what `input` means here (the model input at the top, a block's input
  // inside one); `explicit_input`: the first layer reads it even if it
  // names no inputs.
  void Items(const YamlDoc& doc, const YAML::Node& items, const Env& env, const std::string& prefix,
             const std::string& input, bool explicit_input, const std::string& context) {
    if (!items) throw ConfigError(StrCat(doc.path(), ": ", context, ": needs 'layers'"));
    if (!items.IsSequence() || items.size() == 0) {
      doc.Fail(items, context, "expected a non-empty list of layers");
    }
    const size_t first = out_.size();
    for (const auto& item : items) {
      if (!item.IsMap())
        doc.Fail(item, context, "expected {name: ..., <type>: {...}} or {name: ..., block: ...}");
      const YAML::Node cond = item["if"];
      if (cond && !AsBool(doc, cond, env, StrCat(context, ": if"))) continue;
      const bool reads_input = explicit_input && out_.size() == first;
      if (item["block"]) {
        UseBlock(doc, item, env, prefix, input, reads_input, context);
      } else {
        AddLayer(doc, item, env, prefix, input, reads_input, context);
      }
    }
  }

  std::vector<LayerSpec> Take() { return std::move(out_); }
  const std::map<std::string, BlockDef>& blocks() const { return blocks_; }

  // The env of block `def` with `with` (already evaluated) applied.
  Env BlockEnv(const BlockDef& def, const std::vector<std::pair<const YamlDoc*, YAML::Node>>& withs,
               const std::string& context) const {
    Env env;
    const YAML::Node params = def.node["params"];
    if (params && !params.IsMap())
      def.doc->Fail(params, StrCat("block '", def.name, "'"),
                    "params: expected {name: default, ...}");
    std::vector<std::string> names;
    if (params) {
      for (const auto& kv : params) {
        const std::string n = def.doc->Name(kv.first, StrCat("block '", def.name, "' params"));
        names.push_back(n);
        if (!kv.second.IsNull()) Bind(env, n, kv.second);
      }
    }
    for (const auto& [wdoc, with] : withs) {
      for (const auto& kv : with) {
        const std::string n = wdoc->Name(kv.first, context);
        if (std::find(names.begin(), names.end(), n) == names.end()) {
          wdoc->Fail(kv.first, context,
                     UnknownNameMessage(StrCat("param of block '", def.name, "'"), n, names));
        }
        Bind(env, n, kv.second);
      }
    }
    for (const auto& n : names) {
      if (!env.count(n)) {
        throw ConfigError(StrCat(context, ": block '", def.name, "' needs param '", n, "' (with: {",
                                 n, ": ...})"));
      }
    }
    return env;
  }

  // Evaluates every `$` scalar of `node` in `env` (a copy; `node` is kept).
  YAML::Node Substitute(const YamlDoc& doc, const YAML::Node& node, const Env& env,
                        const std::string& context) const {
    if (node.IsScalar()) {
      const std::string& s = node.Scalar();
      if (s.find('$') == std::string::npos) return node;
      if (IsBareParam(s)) {
        auto it = env.find(s.substr(1));
        if (it != env.end()) return it->second;
      }
      return ToNode(Evaluate(s, env, StrCat(doc.Where(node), ": ", context)));
    }
    if (node.IsSequence()) {
      bool any = false;
      YAML::Node out(YAML::NodeType::Sequence);
      for (const auto& e : node) {
        YAML::Node v = Substitute(doc, e, env, context);
        any |= !v.is(e);
        out.push_back(v);
      }
      return any ? out : node;
    }
    if (node.IsMap()) {
      bool any = false;
      YAML::Node out(YAML::NodeType::Map);
      for (const auto& kv : node) {
        YAML::Node v = Substitute(doc, kv.second, env, context);
        any |= !v.is(kv.second);
        out[kv.first] = v;
      }
      return any ? out : node;
    }
    return node;
  }

 private:
  bool AsBool(const YamlDoc& doc, const YAML::Node& n, const Env& env,
              const std::string& context) const {
    const YAML::Node v = Substitute(doc, n, env, context);
    const Value b = FromNode(v);
    if (b.kind != Value::kBool)
      doc.Fail(n, context,
               StrCat("expected true or false, got '", v.IsScalar() ? v.Scalar() : "a list", "'"));
    return b.b;
  }
  std::string AsName(const YamlDoc& doc, const YAML::Node& n, const Env& env,
                     const std::string& context) const {
    if (!n.IsScalar()) return doc.Name(n, context);  // fails, saying what is there instead
    const YAML::Node v = Substitute(doc, n, env, context);
    if (!v.IsScalar()) doc.Fail(n, context, "expected a name, got a list");
    return v.Scalar();
  }

  // `n` as the block at `prefix` reads it: a layer of the block (emitted),
  // `input`, or at the top level any name (Model::Build checks it).
  std::string Resolve(const YamlDoc& doc, const YAML::Node& where, const std::string& n,
                      const std::string& prefix, const std::string& input,
                      const std::string& context) const {
    if (n == kModelInput) return input;
    if (prefix.empty()) return n;
    const std::string full = Join(prefix, n);
    if (emitted_.count(full)) return full;
    doc.Fail(where, context,
             StrCat("reads '", n, "', which is neither 'input' nor an earlier layer of the block"));
  }

  std::vector<std::string> Inputs(const YamlDoc& doc, const YAML::Node& item, const Env& env,
                                  const std::string& prefix, const std::string& input,
                                  const std::string& context) const {
    std::vector<std::string> ins;
    const YAML::Node in = item["inputs"];
    if (!in) return ins;
    std::vector<YAML::Node> list;
    if (in.IsSequence()) {
      for (const auto& i : in) list.push_back(i);
    } else {
      list.push_back(in);
    }
    for (const auto& i : list) {
      ins.push_back(
          Resolve(doc, i, AsName(doc, i, env, context + ": inputs"), prefix, input, context));
    }
    return ins;
  }

  void AddLayer(const YamlDoc& doc, const YAML::Node& item, const Env& env,
                const std::string& prefix, const std::string& input, bool reads_input,
                const std::string& context) {
    const LayerRegistry& reg = LayerRegistry::Get();
    LayerSpec s;
    YAML::Node params, type_key;
    for (const auto& kv : item) {
      std::string key = doc.Name(kv.first, context);
      if (LayerKeys().count(key)) continue;
      if (key.find('$') != std::string::npos) key = AsName(doc, kv.first, env, context + ": type");
      if (!s.type.empty()) {
        doc.Fail(kv.first, context,
                 StrCat("a layer has one type, got both '", s.type, "' and '", key, "'"));
      }
      s.type = key;
      type_key.reset(kv.first);
      params.reset(kv.second);
    }
    if (!item["name"]) doc.Fail(item, context, "a layer needs a 'name'");
    s.name = Join(prefix, AsName(doc, item["name"], env, context + ": name"));
    const std::string where = prefix.empty() ? StrCat("layer '", s.name, "'")
                                             : StrCat("layer '", s.name, "' (", context, ")");
    if (s.type.empty()) {
      doc.Fail(item, where, StrCat("no layer type given; known types: ", JoinNames(reg.Names())));
    }
    const LayerType* type = reg.Find(s.type);
    if (type == nullptr)
      doc.Fail(type_key, where, UnknownNameMessage("layer type", s.type, reg.Names()));
    s.args = doc.CheckArgs(Substitute(doc, params, env, where), type->schema,
                           StrCat(where, " (", s.type, ")"));
    s.inputs = Inputs(doc, item, env, prefix, input, where);
    if (s.inputs.empty() && reads_input) s.inputs.push_back(input);
    if (const YAML::Node t = item["trainable"]) {
      if (t.IsMap()) {
        for (const auto& kv : t) {
          s.trainable[doc.Name(kv.first, where + ": trainable")] =
              AsBool(doc, kv.second, env, where + ": trainable");
        }
      } else {
        s.trainable[""] = AsBool(doc, t, env, where + ": trainable");
      }
    }
    if (const YAML::Node in = item["init"]) {
      if (!in.IsMap())
        doc.Fail(in, where + ": init", "expected {tensor: scheme}, e.g. {weight: zeros}");
      for (const auto& kv : in) {
        const std::string scheme = AsName(doc, kv.second, env, where + ": init");
        const auto& known = InitSchemes();
        if (std::find(known.begin(), known.end(), scheme) == known.end()) {
          doc.Fail(kv.second, where + ": init", UnknownNameMessage("init scheme", scheme, known));
        }
        if (scheme != "default") s.init[doc.Name(kv.first, where + ": init")] = scheme;
      }
    }
    if (emitted_.count(s.name)) doc.Fail(item, where, "this name is used twice");
    emitted_.insert(s.name);
    out_.push_back(std::move(s));
  }

  void UseBlock(const YamlDoc& doc, const YAML::Node& item, const Env& env,
                const std::string& prefix, const std::string& input, bool reads_input,
                const std::string& context) {
    for (const auto& kv : item) {
      const std::string key = doc.Name(kv.first, context);
      if (!BlockUseKeys().count(key)) {
        doc.Fail(
            kv.first, context,
            StrCat("a block use takes ", JoinNames({BlockUseKeys().begin(), BlockUseKeys().end()}),
                   "; got '", key, "'"));
      }
    }
    if (!item["name"])
      doc.Fail(item, context, "a block use needs a 'name' (the prefix of its layers)");
    const YAML::Node name_node = item["name"];
    const std::string where = StrCat("'", name_node.IsScalar() ? name_node.Scalar() : "?", "'");
    const std::string block = AsName(doc, item["block"], env, where + ": block");
    auto it = blocks_.find(block);
    if (it == blocks_.end()) {
      std::vector<std::string> known;
      for (const auto& kv : blocks_) known.push_back(kv.first);
      doc.Fail(item["block"], where, UnknownNameMessage("block", block, known));
    }
    const BlockDef& def = it->second;
    if (depth_ > 16)
      doc.Fail(item, where,
               StrCat("blocks nest more than 16 deep (does '", block, "' use itself?)"));
    for (const char* key : {"with", "first"}) {
      const YAML::Node n = item[key];
      if (n && !n.IsMap()) doc.Fail(n, StrCat(where, ": ", key), "expected {param: value, ...}");
    }
    auto int_of = [&](const char* key, int64_t fallback) {
      const YAML::Node r = item[key];
      if (!r) return fallback;
      const Value v = FromNode(Substitute(doc, r, env, StrCat(where, ": ", key)));
      if (v.kind != Value::kInt || v.i < 0)
        doc.Fail(r, StrCat(where, ": ", key), "expected an int >= 0");
      return v.i;
    };
    const int64_t repeat = int_of("repeat", -1);  // -1: one instance named `name`
    const int64_t start = int_of("start", 0);
    std::string block_input = input;
    bool explicit_input = reads_input;
    if (item["inputs"]) {
      const auto ins = Inputs(doc, item, env, prefix, input, where);
      if (ins.size() != 1) doc.Fail(item["inputs"], where, "a block reads one input");
      block_input = ins[0];
      explicit_input = true;
    }
    const YAML::Node layers = def.node["layers"];
    const bool templated =
        name_node.IsScalar() && name_node.Scalar().find('$') != std::string::npos;
    ++depth_;
    for (int64_t k = 0; k < std::max<int64_t>(repeat, 1); ++k) {
      if (repeat == 0) break;
      // $index: the instance's number (start + k), in its name, with and first.
      Env outer = env;
      Bind(outer, "index", YAML::Node(std::to_string(start + k)));
      const std::string base = AsName(doc, name_node, outer, where + ": name");
      const std::string inst =
          Join(prefix, repeat < 0 || templated ? base : StrCat(base, ".", start + k));
      const std::string ctx =
          StrCat("block '", block, "' as '", inst, "', used at ", doc.Where(item));
      std::vector<std::pair<const YamlDoc*, YAML::Node>> withs;
      for (const char* key : {"with", "first"}) {
        if (item[key] && (k == 0 || std::string(key) == "with"))
          withs.push_back({&doc, Substitute(doc, item[key], outer, StrCat(where, ": ", key))});
      }
      const Env inner = BlockEnv(def, withs, ctx);
      // The instance's input: what the use says for the first, then the
      // instance before (the previous layer).
      const std::string in = k == 0 && explicit_input ? block_input : Previous(input);
      Items(*def.doc, layers, inner, inst, in, k == 0 && explicit_input, ctx);
    }
    --depth_;
  }

  // The name of the layer before the next one (the model input if none).
  std::string Previous(const std::string& outer_input) const {
    return out_.empty() ? outer_input : out_.back().name;
  }

  const YamlDoc& doc_;
  std::map<std::string, BlockDef> blocks_;
  std::vector<LayerSpec> out_;
  std::set<std::string> emitted_;
  int depth_ = 0;
};

ExpandedModel ExpandLibrary(const YamlDoc& doc, const YAML::Node& where, const std::string& name,
                            const std::vector<std::pair<const YamlDoc*, YAML::Node>>& user_with) {
  const Library& lib = Library::Get();
  const LibraryEntry* entry = lib.Find(name);
  if (entry == nullptr)
    doc.Fail(where, "model.library", UnknownNameMessage("library model", name, lib.Names()));
  const YamlDoc& ldoc = *entry->doc;
  Expander x(doc);
  const std::string block = ldoc.Name(entry->node["block"], StrCat("models.", name, ".block"));
  auto it = x.blocks().find(block);
  if (it == x.blocks().end())
    ldoc.Fail(entry->node["block"], name, StrCat("no block '", block, "'"));
  std::vector<std::pair<const YamlDoc*, YAML::Node>> withs;
  if (entry->node["with"]) withs.push_back({&ldoc, entry->node["with"]});
  for (const auto& w : user_with) withs.push_back(w);
  const Env env = x.BlockEnv(it->second, withs, StrCat("library model '", name, "'"));
  x.Items(*it->second.doc, it->second.node["layers"], env, "", kModelInput, false,
          StrCat("library model '", name, "'"));
  ExpandedModel m;
  m.layers = x.Take();
  if (const YAML::Node in = entry->node["input"]) {
    const YAML::Node v = x.Substitute(ldoc, in, env, StrCat("library model '", name, "': input"));
    std::vector<int64_t> dims;
    for (const auto& d : v) dims.push_back(FromNode(d).i);
    m.input_shape = Shape(dims);
  }
  return m;
}

}  // namespace

ExpandedModel ExpandModel(const YamlDoc& doc, const YAML::Node& model) {
  const YAML::Node library = model["library"];
  const YAML::Node layers = model["layers"];
  const YAML::Node with = model["with"];
  ExpandedModel m;
  if (library) {
    if (layers) doc.Fail(layers, "model", "give either 'library' or 'layers', not both");
    if (model["blocks"])
      doc.Fail(model["blocks"], "model", "a library model brings its own blocks");
    if (with && !with.IsMap()) doc.Fail(with, "model.with", "expected {option: value, ...}");
    std::vector<std::pair<const YamlDoc*, YAML::Node>> withs;
    if (with) withs.push_back({&doc, with});
    m = ExpandLibrary(doc, library, doc.Name(library, "model.library"), withs);
  } else {
    if (with) doc.Fail(with, "model", "'with' sets the options of a 'library' model");
    if (!layers)
      doc.Fail(model, "model", "needs 'layers' (or 'library: NAME' for a library model)");
    Expander x(doc);
    x.AddBlocks(model["blocks"]);
    x.Items(doc, layers, {}, "", kModelInput, false, "model.layers");
    m.layers = x.Take();
  }
  if (const YAML::Node in = model["input"]) {
    std::vector<int64_t> dims;
    if (!in.IsSequence()) doc.Fail(in, "model.input", "expected [C, H, W] or [C, L]");
    for (const auto& d : in) {
      const Value v = FromNode(d);
      if (v.kind != Value::kInt || v.i <= 0) doc.Fail(d, "model.input", "expected positive ints");
      dims.push_back(v.i);
    }
    m.input_shape = Shape(dims);
  }
  return m;
}

std::vector<LibraryModel> LibraryModels() {
  const Library& lib = Library::Get();
  std::vector<LibraryModel> out;
  for (const auto& e : lib.models) {
    LibraryModel m;
    m.name = e.name;
    m.file = e.doc->path();
    if (e.node["doc"]) m.doc = e.node["doc"].Scalar();
    const std::string block = e.node["block"].Scalar();
    auto it = lib.blocks.find(block);
    std::map<std::string, std::string> fixed;
    if (e.node["with"])
      for (const auto& kv : e.node["with"]) fixed[kv.first.Scalar()] = YAML::Dump(kv.second);
    if (it != lib.blocks.end() && it->second.node["params"] && it->second.node["params"].IsMap()) {
      for (const auto& kv : it->second.node["params"]) {
        const std::string n = kv.first.Scalar();
        m.options.emplace_back(n, fixed.count(n) ? fixed[n] : YAML::Dump(kv.second));
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

ExpandedModel ExpandLibraryModel(const std::string& name,
                                 const std::vector<std::string>& overrides) {
  std::string text = StrCat("library: ", name, "\nwith: {}\n");
  YamlDoc doc = YamlDoc::Parse(text, "--model");
  for (const auto& o : overrides) doc.Override(o.rfind("input=", 0) == 0 ? o : "with." + o);
  return ExpandModel(doc, doc.root());
}

namespace {

// A name as a YAML flow scalar: plain when it is one (letters, digits, _
// . - not starting with a digit or a sign), else double-quoted.
std::string YamlName(const std::string& n) {
  bool plain = !n.empty() && (std::isalpha(static_cast<unsigned char>(n[0])) || n[0] == '_');
  for (char c : n)
    plain =
        plain && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-');
  if (plain) return n;
  std::string q = "\"";
  for (char c : n) q += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return q + "\"";
}

}  // namespace

std::string LayerSpecLine(const LayerSpec& s) {
  std::string params;
  for (const auto& [k, v] : s.args.values())
    params += StrCat(params.empty() ? "" : ", ", k, ": ", ParamValueToString(v));
  std::string line = StrCat("- {name: ", YamlName(s.name), ", ", s.type, ": {", params, "}");
  if (!s.inputs.empty()) {
    std::string ins;
    for (const auto& i : s.inputs) ins += StrCat(ins.empty() ? "" : ", ", YamlName(i));
    line += StrCat(", inputs: [", ins, "]");
  }
  for (const auto& [t, on] : s.trainable)
    line += t.empty() ? StrCat(", trainable: ", on ? "true" : "false")
                      : StrCat(", trainable: {", t, ": ", on ? "true" : "false", "}");
  for (const auto& [t, scheme] : s.init) line += StrCat(", init: {", t, ": ", scheme, "}");
  return line + "}";
}

}  // namespace cnnflow
