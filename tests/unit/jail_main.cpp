// The jail tests need root (namespaces, cgroups, pivot_root, dropping capabilities): run
// without it, they report themselves skipped (exit 77), never passed or failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>

int main(int argc, char** argv)
{
    if (geteuid() != 0) {
        std::fputs("SKIP: the jail tests need root\n", stderr);
        return 77;
    }
    return doctest::Context(argc, argv).run();
}
