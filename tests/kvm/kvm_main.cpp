// main() for the kvm tier: these tests need a /dev/kvm (any kind, PVM included). Without
// one they exit 77, which meson reports as skipped, never as passed. run_tier.py starts them
// inside the test host when this host has none.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

int main(int argc, char** argv)
{
    const int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        std::perror("skipped: cannot open /dev/kvm");
        return 77;
    }
    ::close(fd);
    doctest::Context context(argc, argv);
    return context.run();
}
