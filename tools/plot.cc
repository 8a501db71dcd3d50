// Figures of panels (line charts) drawn with cairo's image surface (PNG) or
// SVG surface, chosen by the output's extension. Each panel: a title, axis
// labels, "nice" ticks (1, 2, 5 x 10^k), a light grid; series are lines in
// a run's colour, solid for train and dashed for test, with markers where
// points are few (epochs). One legend for the figure, above the panels.
#include "tools/plot.h"

#include <cairo-svg.h>
#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "ops/error.h"
#include "tools/command_line.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

struct Rgb {
  double r, g, b;
};
// Matplotlib's tab10: distinct at a glance and in print.
const Rgb kPalette[] = {{0.12, 0.47, 0.71}, {1.00, 0.50, 0.05}, {0.17, 0.63, 0.17},
                        {0.84, 0.15, 0.16}, {0.58, 0.40, 0.74}, {0.55, 0.34, 0.29},
                        {0.89, 0.47, 0.76}, {0.50, 0.50, 0.50}, {0.74, 0.74, 0.13},
                        {0.09, 0.75, 0.81}};
Rgb Colour(int i) { return kPalette[i % 10]; }

struct Series {
  std::vector<double> x, y;
  int colour = 0;
  bool dashed = false;
  bool markers = false;
  bool grey = false;  // a reference line (ideal scaling)
};

struct Panel {
  std::string title, xlabel, ylabel;
  std::vector<Series> series;
  bool integer_x = false;  // ticks on whole numbers only (epochs, devices)
  std::string empty_note;  // drawn when the panel has no series
};

struct LegendEntry {
  std::string label;
  int colour = 0;
  bool dashed = false;
  bool markers = false;
  bool grey = false;
};

struct Range {
  double lo = 0, hi = 1;
};

// Ticks at 1, 2 or 5 x 10^k covering [lo, hi] with about `target` steps.
std::vector<double> NiceTicks(Range r, int target, bool integer) {
  double span = r.hi - r.lo;
  double raw = span / target;
  double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (span / step <= target) break;
  }
  if (integer) step = std::max(1.0, std::round(step));
  std::vector<double> t;
  for (double v = std::ceil(r.lo / step - 1e-9) * step; v <= r.hi + 1e-9 * step; v += step)
    t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  return t;
}

std::string TickLabel(double v, double step) {
  char b[32];
  if (std::abs(v) >= 10000 && step >= 1000) {
    std::snprintf(b, sizeof b, "%gk", v / 1000);
  } else {
    const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
    std::snprintf(b, sizeof b, "%.*f", decimals, v);
  }
  return b;
}

Range DataRange(const std::vector<Series>& series, bool x, bool from_zero) {
  double lo = INFINITY, hi = -INFINITY;
  for (const Series& s : series)
    for (double v : x ? s.x : s.y)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!std::isfinite(lo)) return {0, 1};
  if (from_zero) lo = std::min(lo, 0.0);
  if (hi - lo < 1e-12) {
    const double pad = std::max(std::abs(hi) * 0.1, 0.5);
    return {lo - pad, hi + pad};
  }
  const double pad = 0.05 * (hi - lo);
  return {from_zero && lo >= 0 ? lo : lo - pad, hi + pad};
}

class Canvas {
 public:
  explicit Canvas(cairo_t* cr) : cr_(cr) {}

  void Text(double x, double y, const std::string& s, double size, double align_x = 0,
            double align_y = 0, bool bold = false, double angle = 0) {
    cairo_save(cr_);
    cairo_select_font_face(cr_, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr_, size);
    cairo_text_extents_t e;
    cairo_text_extents(cr_, s.c_str(), &e);
    cairo_translate(cr_, x, y);
    cairo_rotate(cr_, angle);
    cairo_move_to(cr_, -align_x * e.x_advance, align_y * size * 0.72);
    cairo_show_text(cr_, s.c_str());
    cairo_restore(cr_);
  }
  double TextWidth(const std::string& s, double size) {
    cairo_save(cr_);
    cairo_select_font_face(cr_, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr_, size);
    cairo_text_extents_t e;
    cairo_text_extents(cr_, s.c_str(), &e);
    cairo_restore(cr_);
    return e.x_advance;
  }
  void Stroke(const Series& s, double width) {
    const Rgb c = s.grey ? Rgb{0.45, 0.45, 0.45} : Colour(s.colour);
    cairo_set_source_rgb(cr_, c.r, c.g, c.b);
    cairo_set_line_width(cr_, width);
    const double dash[] = {7, 4};
    const double dot[] = {2, 4};
    if (s.grey) {
      cairo_set_dash(cr_, dot, 2, 0);
    } else {
      cairo_set_dash(cr_, dash, s.dashed ? 2 : 0, 0);
    }
  }
  void Marker(double x, double y, const Series& s) {
    cairo_set_dash(cr_, nullptr, 0, 0);
    cairo_new_sub_path(cr_);
    cairo_arc(cr_, x, y, 3.5, 0, 2 * M_PI);
    if (s.dashed) {  // test: hollow
      cairo_set_source_rgb(cr_, 1, 1, 1);
      cairo_fill_preserve(cr_);
      Stroke(s, 1.8);
      cairo_set_dash(cr_, nullptr, 0, 0);
      cairo_stroke(cr_);
    } else {
      cairo_fill(cr_);
    }
  }
  cairo_t* cr() { return cr_; }

 private:
  cairo_t* cr_;
};

void DrawPanel(Canvas& cv, const Panel& p, double x0, double y0, double w, double h) {
  cairo_t* cr = cv.cr();
  const double left = 78, right = 30, top = 34, bottom = 54;
  const double px = x0 + left, py = y0 + top, pw = w - left - right, ph = h - top - bottom;
  cairo_set_source_rgb(cr, 0, 0, 0);
  cv.Text(x0 + left + pw / 2, y0 + 14, p.title, 16, 0.5, 0.5, true);
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
  cv.Text(px + pw / 2, py + ph + 42, p.xlabel, 14, 0.5, 0.5);
  cv.Text(x0 + 16, py + ph / 2, p.ylabel, 14, 0.5, 0.5, false, -M_PI / 2);
  if (p.series.empty()) {
    cairo_set_source_rgb(cr, 0.5, 0.5, 0.5);
    cv.Text(px + pw / 2, py + ph / 2, p.empty_note, 14, 0.5, 0.5);
    cairo_rectangle(cr, px, py, pw, ph);
    cairo_set_line_width(cr, 1);
    cairo_stroke(cr);
    return;
  }
  const bool from_zero = p.ylabel.find("accuracy") == std::string::npos;
  const Range rx = DataRange(p.series, true, false), ry = DataRange(p.series, false, from_zero);
  auto X = [&](double v) { return px + (v - rx.lo) / (rx.hi - rx.lo) * pw; };
  auto Y = [&](double v) { return py + ph - (v - ry.lo) / (ry.hi - ry.lo) * ph; };
  // Grid and ticks.
  cairo_set_dash(cr, nullptr, 0, 0);
  const std::vector<double> xt = NiceTicks(rx, 6, p.integer_x), yt = NiceTicks(ry, 6, false);
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1, ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
  cairo_set_line_width(cr, 1);
  for (double v : xt) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, X(v), py);
    cairo_line_to(cr, X(v), py + ph);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cv.Text(X(v), py + ph + 16, TickLabel(v, xstep), 12, 0.5, 0.5);
  }
  for (double v : yt) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, px, Y(v));
    cairo_line_to(cr, px + pw, Y(v));
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cv.Text(px - 8, Y(v), TickLabel(v, ystep), 12, 1, 0.5);
  }
  cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
  cairo_rectangle(cr, px, py, pw, ph);
  cairo_stroke(cr);
  // Series, clipped to the plot area.
  cairo_save(cr);
  cairo_rectangle(cr, px, py, pw, ph);
  cairo_clip(cr);
  for (const Series& s : p.series) {
    cv.Stroke(s, s.grey ? 1.5 : 2.2);
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (i == 0)
        cairo_move_to(cr, X(s.x[i]), Y(s.y[i]));
      else
        cairo_line_to(cr, X(s.x[i]), Y(s.y[i]));
    }
    cairo_stroke(cr);
    if (s.markers)
      for (size_t i = 0; i < s.x.size(); ++i) cv.Stroke(s, 1.8), cv.Marker(X(s.x[i]), Y(s.y[i]), s);
  }
  cairo_restore(cr);
}

// Draws `panels` in `cols` columns under a title and a legend, into `path`
// (.png or .svg).
void WriteFigure(const std::string& path, const std::string& title,
                 const std::vector<LegendEntry>& legend, const std::vector<Panel>& panels,
                 int cols) {
  const std::string ext = fs::path(path).extension().string();
  if (ext != ".png" && ext != ".svg") {
    throw Error(StrCat("-o ", path, ": the file must end in .png or .svg"));
  }
  const int rows = static_cast<int>((panels.size() + cols - 1) / cols);
  const double panel_w = 620, panel_h = 400;
  // The legend: entries in rows that fit the width.
  const double width = std::max(1.0, static_cast<double>(cols)) * panel_w;
  const double legend_font = 14, entry_gap = 28, swatch = 38;
  cairo_surface_t* measure = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, 1, 1);
  cairo_t* mcr = cairo_create(measure);
  Canvas mcv(mcr);
  std::vector<std::vector<const LegendEntry*>> lines(1);
  double line_w = 0;
  for (const LegendEntry& e : legend) {
    const double ew = swatch + 8 + mcv.TextWidth(e.label, legend_font) + entry_gap;
    if (line_w + ew > width - 40 && !lines.back().empty()) lines.emplace_back(), line_w = 0;
    lines.back().push_back(&e);
    line_w += ew;
  }
  cairo_destroy(mcr);
  cairo_surface_destroy(measure);
  const double head = 48 + 24 * static_cast<double>(lines.size()) + 10;
  const double height = head + rows * panel_h;

  const std::string tmp = path + ".tmp";
  cairo_surface_t* surface =
      ext == ".svg" ? cairo_svg_surface_create(tmp.c_str(), width, height)
                    : cairo_image_surface_create(CAIRO_FORMAT_ARGB32, static_cast<int>(width),
                                                 static_cast<int>(height));
  cairo_t* cr = cairo_create(surface);
  Canvas cv(cr);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_set_source_rgb(cr, 0, 0, 0);
  cv.Text(width / 2, 22, title, 18, 0.5, 0.5, true);
  for (size_t l = 0; l < lines.size(); ++l) {
    double w = 0;
    for (const LegendEntry* e : lines[l])
      w += swatch + 8 + cv.TextWidth(e->label, legend_font) + entry_gap;
    double x = (width - w + entry_gap) / 2;
    const double y = 52 + 24 * static_cast<double>(l);
    for (const LegendEntry* e : lines[l]) {
      Series s;
      s.colour = e->colour;
      s.dashed = e->dashed;
      s.grey = e->grey;
      cv.Stroke(s, e->grey ? 1.5 : 2.2);
      cairo_move_to(cr, x, y);
      cairo_line_to(cr, x + swatch, y);
      cairo_stroke(cr);
      if (e->markers) cv.Stroke(s, 1.8), cv.Marker(x + swatch / 2, y, s);
      cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
      cv.Text(x + swatch + 8, y, e->label, legend_font, 0, 0.5);
      x += swatch + 8 + cv.TextWidth(e->label, legend_font) + entry_gap;
    }
  }
  for (size_t i = 0; i < panels.size(); ++i) {
    DrawPanel(cv, panels[i], static_cast<double>(i % cols) * panel_w,
              head + static_cast<double>(i / cols) * panel_h, panel_w, panel_h);
  }
  cairo_destroy(cr);
  cairo_status_t status = cairo_surface_status(surface);
  if (status == CAIRO_STATUS_SUCCESS && ext == ".png")
    status = cairo_surface_write_to_png(surface, tmp.c_str());
  cairo_surface_finish(surface);
  if (status == CAIRO_STATUS_SUCCESS) status = cairo_surface_status(surface);
  cairo_surface_destroy(surface);
  std::error_code ec;
  if (status != CAIRO_STATUS_SUCCESS) {
    fs::remove(tmp, ec);
    throw Error(StrCat("cannot write ", path, ": ", cairo_status_to_string(status)));
  }
  fs::rename(tmp, path, ec);
  if (ec) throw Error(StrCat("cannot rename ", tmp, " to ", path, ": ", ec.message()));
}

// A CSV file as columns by header name; empty fields are NaN.
std::map<std::string, std::vector<double>> ReadCsv(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw Error(StrCat("cannot read ", file.string()));
  std::string line;
  std::getline(in, line);
  std::vector<std::string> names;
  std::stringstream header(line);
  for (std::string n; std::getline(header, n, ',');) names.push_back(n);
  std::map<std::string, std::vector<double>> cols;
  for (const auto& n : names) cols[n];
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::stringstream row(line);
    std::string field;
    for (size_t i = 0; i < names.size(); ++i) {
      if (!std::getline(row, field, ',')) field.clear();
      cols[names[i]].push_back(field.empty() ? NAN : std::strtod(field.c_str(), nullptr));
    }
  }
  return cols;
}

// The (x, y) points of column y against column x where both are set.
Series Points(const std::map<std::string, std::vector<double>>& cols, const std::string& x,
              const std::string& y, double scale) {
  Series s;
  auto xi = cols.find(x), yi = cols.find(y);
  if (xi == cols.end() || yi == cols.end()) return s;
  for (size_t i = 0; i < xi->second.size() && i < yi->second.size(); ++i) {
    if (std::isfinite(xi->second[i]) && std::isfinite(yi->second[i])) {
      s.x.push_back(xi->second[i]);
      s.y.push_back(scale * yi->second[i]);
    }
  }
  return s;
}

constexpr const char* kPlotUsage =
    R"(usage: cnnflow plot RUN_DIR... -o FILE.png|FILE.svg [--title TEXT]

  loss and accuracy, train (solid) and test (dashed), against epochs (the
  runs' metrics.csv) and steps (steps.csv, every train.log_every steps), one
  colour per run; a run without a test set has no test curve
)";

}  // namespace

int RunPlot(const std::vector<std::string>& args) {
  std::vector<std::string> runs;
  std::string out, title = "training curves";
  try {
    CommandLine cmd(args);
    while (cmd.Next()) {
      if (cmd.Is("-h", "--help")) return std::printf("%s", kPlotUsage), 0;
      if (cmd.Is("-o", "--out")) {
        out = cmd.Value();
      } else if (cmd.Is("--title")) {
        title = cmd.Value();
      } else if (cmd.IsOption()) {
        cmd.Reject();
      } else {
        runs.push_back(cmd.arg());
      }
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "cnnflow plot: %s\n\n%s", e.what(), kPlotUsage);
    return 2;
  }
  if (runs.empty() || out.empty()) {
    std::fprintf(stderr, "cnnflow plot: needs RUN_DIR... and -o FILE\n\n%s", kPlotUsage);
    return 2;
  }
  try {
    Panel loss_e{"loss per epoch", "epoch", "loss", {}, true, ""};
    Panel acc_e{"accuracy per epoch", "epoch", "accuracy (%)", {}, true, ""};
    Panel loss_s{"loss per step", "step (optimizer steps)",    "loss", {},
                 false,           "no steps.csv in these runs"};
    Panel acc_s{"accuracy per step",         "step (optimizer steps)", "accuracy (%)", {}, false,
                "no steps.csv in these runs"};
    std::vector<LegendEntry> legend;
    bool any_test = false;
    for (size_t r = 0; r < runs.size(); ++r) {
      const fs::path dir = runs[r];
      if (!fs::is_directory(dir)) throw Error(StrCat(runs[r], ": no such run folder"));
      const fs::path metrics = dir / "metrics.csv";
      if (!fs::exists(metrics))
        throw Error(StrCat(runs[r], ": has no metrics.csv (not a run folder?)"));
      const auto m = ReadCsv(metrics);
      const int colour = static_cast<int>(r);
      std::string name = fs::path(runs[r]).lexically_normal().filename().string();
      if (name.empty())
        name = fs::path(runs[r]).lexically_normal().parent_path().filename().string();
      legend.push_back({name, colour, false, false});
      std::string what;
      auto add = [&](Panel& p, const std::map<std::string, std::vector<double>>& cols,
                     const std::string& x, const std::string& y, double scale, bool test,
                     bool markers) {
        Series s = Points(cols, x, y, scale);
        if (s.x.empty()) return size_t{0};
        s.colour = colour;
        s.dashed = test;
        s.markers = markers;
        const size_t n = s.x.size();
        p.series.push_back(std::move(s));
        return n;
      };
      const size_t epochs = add(loss_e, m, "epoch", "train_loss", 1, false, true);
      add(acc_e, m, "epoch", "train_accuracy", 100, false, true);
      const size_t tested = add(loss_e, m, "epoch", "test_loss", 1, true, true);
      add(acc_e, m, "epoch", "test_accuracy", 100, true, true);
      any_test = any_test || tested > 0;
      what =
          StrCat(epochs, " epoch(s), ", tested > 0 ? "train and test" : "train only (no test set)");
      if (fs::exists(dir / "steps.csv")) {
        const auto st = ReadCsv(dir / "steps.csv");
        const size_t steps = add(loss_s, st, "step", "train_loss", 1, false, false);
        add(acc_s, st, "step", "train_accuracy", 100, false, false);
        add(loss_s, st, "step", "test_loss", 1, true, true);
        add(acc_s, st, "step", "test_accuracy", 100, true, true);
        what += StrCat(", ", steps, " logged step(s)");
      } else {
        what += ", no steps.csv";
      }
      std::printf("%s: %s\n", name.c_str(), what.c_str());
    }
    legend.push_back({"train", -1, false, false, true});
    if (any_test) legend.push_back({"test", -1, true, true, true});
    // The style keys in grey: dotted is the grey reference style, so draw
    // train/test keys as black solid / dashed instead.
    for (LegendEntry& e : legend) {
      if (e.colour < 0) e.grey = false, e.colour = 7;
    }
    std::vector<Panel> panels = {loss_e, acc_e};
    const bool steps = !loss_s.series.empty();
    if (steps) panels.push_back(loss_s), panels.push_back(acc_s);
    WriteFigure(out, title, legend, panels, 2);
    std::printf("wrote %s: %zu run(s), %zu panels\n", out.c_str(), runs.size(), panels.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cnnflow plot: error: %s\n", e.what());
    return 1;
  }
}

void PlotScaling(const std::vector<BenchRow>& rows, const std::string& path,
                 const std::string& title) {
  CNNFLOW_ENFORCE(!rows.empty(), "no benchmark rows to plot");
  Series rate, speedup, efficiency, ideal_rate, ideal_speedup, ideal_eff;
  const double base_devices = rows[0].devices * rows[0].processes;
  for (const BenchRow& r : rows) {
    const double d = r.devices * r.processes;
    rate.x.push_back(d), rate.y.push_back(r.images_per_s);
    speedup.x.push_back(d), speedup.y.push_back(r.speedup);
    efficiency.x.push_back(d), efficiency.y.push_back(100 * r.efficiency);
    ideal_rate.x.push_back(d), ideal_rate.y.push_back(rows[0].images_per_s * d / base_devices);
    ideal_speedup.x.push_back(d), ideal_speedup.y.push_back(d / base_devices);
    ideal_eff.x.push_back(d), ideal_eff.y.push_back(100);
  }
  for (Series* s : {&rate, &speedup, &efficiency}) s->markers = true;
  for (Series* s : {&ideal_rate, &ideal_speedup, &ideal_eff}) s->grey = true;
  const std::string x = rows[0].processes > 1 || rows.back().processes > 1
                            ? "devices (replicas x processes)"
                            : "devices (replicas)";
  std::vector<Panel> panels = {
      {"throughput", x, "images/s", {ideal_rate, rate}, true, ""},
      {"speedup", x, "speedup (x)", {ideal_speedup, speedup}, true, ""},
      {"efficiency", x, "efficiency (%)", {ideal_eff, efficiency}, true, ""}};
  WriteFigure(path, "scaling: " + title,
              {{"measured", 0, false, true, false}, {"ideal (linear)", 0, false, false, true}},
              panels, 3);
}

}  // namespace cnnflow
