// Writes the serial console's output (SerialDevice::take_output) to the console fd from the
// I/O loop, through io_uring: a reader who stops reading stalls only this writer, never a
// vCPU and never the device lock, and the loop's cancellation ends the stalled write when
// the VM stops. While the reader stalls, the device's bounded buffer drops what does not fit;
// this warns once per burst of loss (at most every 10 s) and gives the total at the end.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "common/fd.hpp"
#include "core/event_loop.hpp"

namespace agentvm {

class SerialDevice;

class ConsoleWriter {
public:
    // The most taken from the device per write.
    static constexpr size_t chunk_size = 16 * 1024;

    // fd (not owned) must outlive the writer; the writer attaches itself to serial.
    ConsoleWriter(EventLoop& loop, SerialDevice& serial, int fd);
    ~ConsoleWriter();
    ConsoleWriter(const ConsoleWriter&) = delete;
    ConsoleWriter& operator=(const ConsoleWriter&) = delete;

    // The VM is stopping (the vCPUs are joined) and the loop is about to drain: cancels the
    // write in flight, whose reader may never read, and writes nothing more through the loop.
    void stop();
    // After the loop drained: writes what is left as far as the fd takes it without waiting
    // on its reader (a regular file takes it all), counts the rest as dropped, and reports
    // the total loss, if any.
    void finish();

    // Console bytes lost to a slow reader so far: dropped by the device, or left unwritten by
    // finish(). (After a failed write, the rest is discarded without counting.)
    uint64_t dropped() const;

private:
    void wake();  // any thread
    void pump();
    void on_written(int32_t res);
    void report_drops();
    void fail(int err);

    EventLoop& loop_;
    SerialDevice& serial_;
    int fd_;
    Fd wake_fd_;
    std::string chunk_;      // the bytes being written
    size_t chunk_done_ = 0;  // ... of which the fd took this many
    iovec iov_{};
    bool writing_ = false;
    bool stopped_ = false;
    bool failed_ = false;
    uint64_t unwritten_ = 0;  // left over by finish()
    uint64_t reported_ = 0;
    std::optional<std::chrono::steady_clock::time_point> last_report_;
};

} // namespace agentvm
