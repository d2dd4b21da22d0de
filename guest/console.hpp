// Console output of PID 1. Every line is one write() to fd 1 (the kernel's /dev/console,
// the serial port), unbuffered, so it interleaves cleanly with the children's output and
// nothing is lost in a stdio buffer when the VM powers off.
#pragma once

namespace agentvm {

// Makes fds 0, 1 and 2 refer to /dev/console when the kernel could not open it for us
// (no /dev/console in the root before devtmpfs was mounted). Needs /dev mounted.
void ensure_console();

// Prints "agentvm-init: <message>\n". The VMM and the benchmarks match these lines.
void say(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Prints "agentvm-init: <what>: <strerror(errno)>\n", keeping errno intact.
void say_errno(const char* what);

// Waits until the serial port has sent everything written so far: a reboot right after a
// write would otherwise drop the tail of the console buffer.
void drain_console();

} // namespace agentvm
