// Result<T>: a value or a non-ok Status. Follows the std::expected interface (has_value, value,
// error, operator*, operator->) so it can become std::expected<T, Status> later.
// Thread-safety: a value type.
#pragma once

#include <utility>
#include <variant>

#include "common/base/status.h"

namespace penstock {

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::in_place_index<1>, std::move(status)) {  // NOLINT
    PENSTOCK_CHECK(!std::get<1>(v_).is_ok());
  }

  bool has_value() const { return v_.index() == 0; }
  bool is_ok() const { return has_value(); }

  T& value() & { PENSTOCK_CHECK(has_value()); return std::get<0>(v_); }
  const T& value() const& { PENSTOCK_CHECK(has_value()); return std::get<0>(v_); }
  T&& value() && { PENSTOCK_CHECK(has_value()); return std::get<0>(std::move(v_)); }

  const Status& error() const& { PENSTOCK_CHECK(!has_value()); return std::get<1>(v_); }
  Status&& error() && { PENSTOCK_CHECK(!has_value()); return std::get<1>(std::move(v_)); }

  // The status: ok when a value is held.
  Status status() const { return has_value() ? Status::ok() : std::get<1>(v_); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

namespace detail {
template <class T>
Status to_status(const Result<T>& r) { return r.status(); }
}  // namespace detail

}  // namespace penstock
