// LineReader: the lines of a text held in memory (/proc files, /etc/fuse.conf), one at a time.
// Thread-safety: a value object for one thread.
#pragma once

#include <cstddef>
#include <string_view>

namespace penstock {

// while (lines.next(&line)) ...: each line without its '\n'; a last line without one counts too,
// an empty text has none.
class LineReader {
 public:
  explicit LineReader(std::string_view text) : text_(text) {}

  bool next(std::string_view* line) {
    if (pos_ >= text_.size()) return false;
    size_t end = text_.find('\n', pos_);
    if (end == std::string_view::npos) end = text_.size();
    *line = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return true;
  }

 private:
  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace penstock
