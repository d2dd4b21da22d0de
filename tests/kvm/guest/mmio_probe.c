/* Exercises MMIO exit dispatch: reads a test device's ID register, writes a value and reads
 * it back, and reports each on the trace port. */
#include "guest.h"

#define TEST_MMIO 0xd0800000ull

uint32_t guest_main(void)
{
    trace(mmio_read32(TEST_MMIO));
    mmio_write32(TEST_MMIO + 4, 0x12345678);
    trace(mmio_read32(TEST_MMIO + 4));
    trace(*(volatile uint8_t*)(TEST_MMIO + 9));
    /* An address no device claims reads as all ones. */
    trace(mmio_read32(0xd0900000ull));
    return 0;
}
