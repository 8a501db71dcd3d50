// The UCR/UEA time-series classification archive's `.ts` text format, as
// sktime writes and reads it: `#` comment lines, an `@` header
// (@problemName, @timeStamps, @missing, @univariate, @dimensions,
// @equalLength, @seriesLength, @classLabel true a b c), `@data`, then one
// case per line: channels separated by `:`, values by `,`, the class label
// last. Series may differ in length between cases (not between the channels
// of one case). Header keys are case-insensitive, as in sktime.
//
// Missing values (`?`, or NaN) are filled by linear interpolation between
// the nearest known values of the same channel; before the first / after
// the last known value the nearest known value is repeated; a channel with
// no known value is all 0. (Interpolation keeps the series' shape, where 0
// would put spikes into standardised data.)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cnnflow {

struct TsFile {
  std::string path;  // for messages
  std::string problem_name;
  std::vector<std::string> class_labels;  // the @classLabel list, in its order
  int64_t channels = 0;
  // Case i: channels * lengths[i] floats, channel-major ([C, L_i]).
  std::vector<std::vector<float>> cases;
  std::vector<int64_t> lengths;
  std::vector<int64_t> labels;  // index into class_labels
  int64_t missing_values = 0;   // `?` / NaN values that were filled

  int64_t size() const { return static_cast<int64_t>(cases.size()); }
  int64_t max_length() const;
  int64_t min_length() const;
};

// Parses `.ts` text; `path` only names the file in messages. Throws Error
// "PATH:LINE: what" for a bad number (the text, channel and position), a
// case whose channel count differs from @dimensions / the first case's,
// channels of one case with different lengths, a length that contradicts
// @equalLength/@seriesLength, a label not in @classLabel (listing them), a
// data line before `@data`, an unsupported header (@timeStamps true,
// @classLabel false, @targetLabel true), an infinite value; "PATH: ..." for
// a file with no `@data` or no cases. Accepts CRLF line ends and a last
// line without a newline.
TsFile ParseTs(std::string_view text, const std::string& path);

// Reads and parses the file at `path` (Error naming it if it cannot be read).
TsFile ReadTsFile(const std::string& path);

}  // namespace cnnflow
