// RpcClient: typed calls over a Channel. call<M>() blocks the calling thread until the reply or the
// deadline (Channel::call_sync); call_async<M>() returns at once and runs the callback on an I/O thread, which is how
// the client library fans one request out to many data servers in parallel.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <memory>
#include <span>

#include "common/net/transport.h"
#include "common/proto/codec.h"
#include "common/proto/method.h"

namespace penstock::rpc {

struct CallOptions {
  std::span<const uint8_t> bulk_out;         // sent after the request; alive until completion
  std::span<uint8_t> bulk_in;                // receives the response bulk; alive until completion
  uint32_t* bulk_received = nullptr;         // if set, receives the response bulk length
  std::chrono::milliseconds timeout{0};      // 0: the client's default
};

class RpcClient {
 public:
  RpcClient(std::shared_ptr<net::Channel> channel, std::chrono::milliseconds default_timeout)
      : channel_(std::move(channel)), default_timeout_(default_timeout) {}

  template <proto::RpcMethod M>
  void call_async(const typename M::Request& req, const CallOptions& opts,
                  std::function<void(Result<typename M::Response>)> done) {
    net::OutgoingCall call = make_call<M>(req, opts);
    uint32_t* received = opts.bulk_received;
    channel_->start_call(std::move(call), [done = std::move(done), received](Result<net::CallReply> r) {
      done(decode_reply<M>(std::move(r), received));
    });
  }

  // call_async() for a caller that waits: on TCP the calling thread sends and reads its own
  // response (net::Channel::call_sync), no I/O thread involved.
  template <proto::RpcMethod M>
  Result<typename M::Response> call(const typename M::Request& req, const CallOptions& opts = {}) {
    return decode_reply<M>(channel_->call_sync(make_call<M>(req, opts)), opts.bulk_received);
  }

  // call() or call_async(): `done` runs with the result on the calling thread before this returns
  // when `blocking` (for a caller that waits for this one call alone: on TCP no I/O thread then
  // touches it), else on an I/O thread.
  template <proto::RpcMethod M>
  void call_either(const typename M::Request& req, const CallOptions& opts, bool blocking,
                   std::function<void(Result<typename M::Response>)> done) {
    if (blocking) {
      done(call<M>(req, opts));
    } else {
      call_async<M>(req, opts, std::move(done));
    }
  }

  const std::shared_ptr<net::Channel>& channel() const { return channel_; }

 private:
  template <proto::RpcMethod M>
  net::OutgoingCall make_call(const typename M::Request& req, const CallOptions& opts) const {
    net::OutgoingCall call;
    call.service = M::kService;
    call.method = M::kId;
    call.message = proto::encode(req);
    call.bulk_out = opts.bulk_out;
    call.bulk_in = opts.bulk_in;
    call.deadline = net::Clock::now() + (opts.timeout.count() > 0 ? opts.timeout : default_timeout_);
    return call;
  }

  // The typed response of a call's reply; `received` (if set) gets the reply's bulk length.
  template <proto::RpcMethod M>
  static Result<typename M::Response> decode_reply(Result<net::CallReply> r, uint32_t* received) {
    if (!r.has_value()) return std::move(r).error().with_context(std::string(M::kName));
    if (received != nullptr) *received = r->bulk_len;
    auto msg = proto::decode<typename M::Response>(
        proto::bytes_of(r->message));
    if (!msg.has_value()) return std::move(msg).error().with_context(std::string(M::kName) + " response");
    return msg;
  }

  std::shared_ptr<net::Channel> channel_;
  std::chrono::milliseconds default_timeout_;
};

}  // namespace penstock::rpc
