/* Writes a greeting through the 8250 THR, polling LSR.THRE as a driver without interrupts does,
 * and reads the scratch register back. Returns 0 on success. */
#include "guest.h"

#define COM1 0x3f8

uint32_t guest_main(void)
{
    static const char msg[] = "hello from a tiny guest\n";
    outb(COM1 + 7, 0x5a);       /* scratch */
    if (inb(COM1 + 7) != 0x5a)
        return 1;
    outb(COM1 + 3, 0x80);       /* DLAB on: divisor latch */
    outb(COM1 + 0, 0x01);
    outb(COM1 + 1, 0x00);
    if (inb(COM1 + 0) != 0x01)
        return 2;
    outb(COM1 + 3, 0x03);       /* 8N1, DLAB off */
    if (inb(COM1 + 3) != 0x03)
        return 3;
    for (const char* p = msg; *p; ++p) {
        while (!(inb(COM1 + 5) & 0x20))
            ;
        outb(COM1, (uint8_t)*p);
    }
    return 0;
}
