#include "pipeline/progress.h"

#include <unistd.h>

#include <cmath>

#include "ops/error.h"

namespace cnnflow {

Progress Progress::ForStderr() { return Progress(stderr, isatty(fileno(stderr)) != 0); }

std::string FormatDuration(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return buf;
}

void Progress::Batch(const std::string& pass, int64_t epoch, int64_t epochs, int64_t batch,
                     int64_t batches, double mean_loss, double accuracy, double images_per_s,
                     double elapsed_s) {
  const double eta = batch > 0 ? elapsed_s / batch * (batches - batch) : 0;
  char line[256];
  std::snprintf(line, sizeof line,
                "%-5s epoch %lld/%lld  step %lld/%lld  loss %.4f  acc %.2f%%  %.0f img/s  ETA %s",
                pass.c_str(), static_cast<long long>(epoch), static_cast<long long>(epochs),
                static_cast<long long>(batch), static_cast<long long>(batches), mean_loss,
                100 * accuracy, images_per_s, FormatDuration(eta).c_str());
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s", line);
    std::fflush(out_);
    open_line_ = true;
    return;
  }
  const int64_t decile = batches > 0 ? batch * 10 / batches : 0;
  if (decile != last_decile_ || batch == batches) {
    last_decile_ = decile;
    std::fprintf(out_, "%s\n", line);
    std::fflush(out_);
  }
}

void Progress::EndPass() {
  if (open_line_) std::fprintf(out_, "\n");
  open_line_ = false;
  last_decile_ = -1;
}

void Progress::Line(const std::string& text) {
  EndPass();
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

}  // namespace cnnflow
