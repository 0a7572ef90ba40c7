#pragma once

#include <memory>
#include <string>

#include <gloo/transport/device.h>

namespace tessera::comm {

// Gloo's TCP device (gloo::transport::tcp::CreateDevice) with one fix: a
// connection that breaks also fails the sends queued for its socket.
//
// Gloo queues a send it could not write at once (the socket buffer full,
// or the write refused with EPIPE / ECONNRESET by a peer that just died)
// for its event loop. When the connection then breaks, Gloo wakes every
// waiting operation on it except these: its tcp::Pair::signalException
// walks the queue for bound buffers only, so an unbound buffer's send (what
// every collective and point-to-point operation uses) waits out its whole
// deadline (parallel.timeout, 30 s and more) after its peer is known gone.
// Debian 12's Gloo (2022) and upstream's (2025) both do this. The pair
// here wakes them with the connection's error as it closes.
std::shared_ptr<gloo::transport::Device> make_tcp_device(const std::string& host);

}  // namespace tessera::comm
