// Progress output during a run: a live line on a terminal (epoch,
// step/steps, loss, images/s, ETA), plain lines every tenth of a pass when
// the output is a file or a pipe.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace cnnflow {

class Progress {
 public:
  // tty: redraw one line with \r; else print a line every ~10% of a pass.
  Progress(FILE* out, bool tty) : out_(out), tty_(tty) {}
  static Progress ForStderr();

  void Batch(const std::string& pass, int64_t epoch, int64_t epochs, int64_t batch, int64_t batches,
             double mean_loss, double accuracy, double images_per_s, double elapsed_s);
  // Ends a live line (so the next output starts on a fresh line).
  void EndPass();
  void Line(const std::string& text);

 private:
  FILE* out_;
  bool tty_;
  bool open_line_ = false;
  int64_t last_decile_ = -1;
};

// "1:02:03" or "2:03".
std::string FormatDuration(double seconds);

}  // namespace cnnflow
