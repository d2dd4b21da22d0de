// The unprivileged uids (each with the gid of the same number) serve's VMMs run as, one per
// running VM (vmm/jail.hpp, JailIdentity): --jail-uid-range FIRST:COUNT, or none.
//
// The default range, 1879048192 (0x70000000) and the 65536 after it, lies above the ranges
// systemd and Debian hand out (system and regular users, DynamicUser, systemd-nspawn's
// containers up to 1879048191, /etc/subuid's default 100000-600100000) and below 2^31, where
// some tools still take ids as signed; serve refuses a range holding a user or group of the
// host's, or ids delegated to a user's containers (subordinate_ids.hpp). An id freed by an ended VM goes back in line behind every id never used, so one is
// not handed to a new VM while the last one's files could still be about.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

namespace agentvm {

struct JailIdRange {
    uint32_t first = 0;
    uint32_t count = 0;
};

inline constexpr JailIdRange default_jail_id_range{1879048192, 65536};

// "FIRST:COUNT", or "none" (nullopt: the VMMs keep serve's own uid). Throws Error naming what
// is wrong: not numbers, 0 in the range, a range past 2^31 - 1.
std::optional<JailIdRange> parse_jail_id_range(const std::string& text);

// Throws Error naming the first user or group of the host (getpwent, getgrent) whose id lies
// in the range.
void check_no_accounts_in(const JailIdRange& range);

// Throws Error naming the capabilities serve lacks to run VMMs as their own uids: CAP_CHOWN
// (sharing directories with them, taking their snapshots back), CAP_SETUID, CAP_SETGID and
// CAP_KILL (their supervisors and jails), beside the jail's own CAP_SYS_ADMIN and CAP_SETPCAP.
void check_jail_id_privileges();

class JailIds {
public:
    explicit JailIds(JailIdRange range) : range_(range) {}
    // A free id, or nullopt when every id of the range belongs to a running VM.
    std::optional<uint32_t> take();
    void give_back(uint32_t id);
    size_t in_use() const { return in_use_; }

private:
    JailIdRange range_;
    uint32_t never_used_ = 0;  // ids first .. first + never_used_ - 1 have been handed out
    std::deque<uint32_t> freed_;
    size_t in_use_ = 0;
};

} // namespace agentvm
