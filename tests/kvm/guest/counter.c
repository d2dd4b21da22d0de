/* For vCPU state get/set: adds the value the test put in RBX to a loop count and returns it,
 * proving the registers the VMM set are the ones the guest ran with. */
#include "guest.h"

uint32_t guest_main(void)
{
    uint64_t seed;
    __asm__ volatile("" : "=b"(seed));
    uint32_t sum = (uint32_t)seed;
    for (uint32_t i = 0; i < 100; ++i)
        sum += 1;
    return sum;
}
