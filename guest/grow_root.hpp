// agentvm --disk-size gives the guest a root disk larger than the image its filesystem was
// made in; the extra space is of use only once the filesystem covers it. ext4 grows while
// mounted, so init does it before anything else runs, and the guest's commands meet ENOSPC
// at the disk's size, which the host enforces, and not the image's.
#pragma once

namespace agentvm {

// Grows the ext4 filesystem mounted at / to the size of its block device (sysfs must be
// mounted). Says on the console what it did, or why it could not.
void grow_root_filesystem();

} // namespace agentvm
