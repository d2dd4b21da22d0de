/* For snapshot/restore: counts 1 to 1000, reporting each count on the trace port, and
 * returns the sum. The count lives in a register and the sum in memory, so a restore that
 * loses either breaks the sequence or the result. */
#include "guest.h"

static volatile uint32_t sum;

uint32_t guest_main(void)
{
    for (uint32_t i = 1; i <= 1000; ++i) {
        sum += i;
        trace(i);
    }
    return sum;
}
