// File operations on the image user's behalf (run_as.hpp): stat, list_dir, make_dir, move,
// remove and watch check permissions and create files as that user would, not as root,
// though the agent stays root.
//
// Only the calling thread changes: its file-system uid and gid and its supplementary groups,
// through the raw system calls (the kernel keeps credentials per thread; glibc's setgroups
// wrapper would change every thread of the agent, among them those starting commands).
// setfsuid to a non-zero uid also drops the thread's file capabilities (CAP_DAC_OVERRIDE,
// CAP_FOWNER, ...), and setting it back to 0 restores them.
#pragma once

#include <sys/types.h>

#include <vector>

namespace agentvm {

class ImageUserFiles {
public:
    // Takes on run_as()'s credentials on this thread; nothing when calls run as root. Throws
    // CallError(internal) when the kernel refuses.
    ImageUserFiles();
    // Back to the thread's own credentials.
    ~ImageUserFiles();
    ImageUserFiles(const ImageUserFiles&) = delete;
    ImageUserFiles& operator=(const ImageUserFiles&) = delete;

private:
    void restore() noexcept;

    bool switched_ = false;
    uid_t saved_fsuid_ = 0;
    gid_t saved_fsgid_ = 0;
    std::vector<gid_t> saved_groups_;
};

} // namespace agentvm
