/* Port and MMIO access for tiny test guests. */
#pragma once

#include <stdint.h>

#define RESULT_PORT 0x500  /* a 32-bit write here is recorded by the test */
#define TRACE_PORT 0x504   /* progress values, recorded in order */

static inline void outb(uint16_t port, uint8_t v) { __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port)); }
static inline uint8_t inb(uint16_t port)
{
    uint8_t v;
    __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}
static inline void outl(uint16_t port, uint32_t v) { __asm__ volatile("outl %0, %1" : : "a"(v), "Nd"(port)); }
static inline uint32_t mmio_read32(uint64_t addr) { return *(volatile uint32_t*)addr; }
static inline void mmio_write32(uint64_t addr, uint32_t v) { *(volatile uint32_t*)addr = v; }
static inline void barrier(void) { __asm__ volatile("" ::: "memory"); }
static inline void trace(uint32_t v) { outl(TRACE_PORT, v); }
