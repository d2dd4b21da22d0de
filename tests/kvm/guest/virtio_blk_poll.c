/* A polled virtio-mmio (version 2) block driver: negotiates VERSION_1, sets up queue 0 with
 * 8 entries, reads sector 0, writes sector 1 and reads it back, spinning on the used ring
 * instead of taking interrupts. Each step reports on the trace port; the result port gets 0
 * on success or the number of the step that failed. */
#include <linux/virtio_blk.h>
#include <linux/virtio_config.h>
#include <linux/virtio_mmio.h>
#include <linux/virtio_ring.h>

#include "guest.h"

#define BASE 0xd0000000ull
#define QSIZE 8
/* A lost completion must end as a failed step, not a hang, but the device thread must get
 * its turn first: on a one-CPU host (the test host's L1) it runs only once the spinning vCPU
 * thread is preempted, and the nested guest spins fast (~2 million spins were too few there).
 * At ~1 ns a spin this waits seconds on hardware; on PVM (~1 us a spin at CPL0) the test's
 * own timeout ends a hang first. */
#define SPIN_LIMIT 4000000000u

static struct vring_desc desc[QSIZE] __attribute__((aligned(16)));
static struct {
    uint16_t flags, idx, ring[QSIZE], used_event;
} avail __attribute__((aligned(2)));
static struct {
    uint16_t flags, idx;
    struct vring_used_elem ring[QSIZE];
    uint16_t avail_event;
} used __attribute__((aligned(4)));
static struct virtio_blk_outhdr hdr;
static uint8_t data[512];
static volatile uint8_t status;

static uint32_t reg(uint32_t off) { return mmio_read32(BASE + off); }
static void set(uint32_t off, uint32_t v) { mmio_write32(BASE + off, v); }

/* Submits header + data + status as one chain and waits for the device to return it. */
static int request(uint32_t type, uint64_t sector, int data_writable)
{
    hdr.type = type;
    hdr.ioprio = 0;
    hdr.sector = sector;
    status = 0xff;
    desc[0] = (struct vring_desc){(uint64_t)&hdr, sizeof(hdr), VRING_DESC_F_NEXT, 1};
    desc[1] = (struct vring_desc){(uint64_t)data, sizeof(data),
                                  (uint16_t)(VRING_DESC_F_NEXT | (data_writable ? VRING_DESC_F_WRITE : 0)), 2};
    desc[2] = (struct vring_desc){(uint64_t)&status, 1, VRING_DESC_F_WRITE, 0};
    const uint16_t before = used.idx;
    avail.ring[avail.idx % QSIZE] = 0;
    barrier();
    avail.idx++;
    barrier();
    set(VIRTIO_MMIO_QUEUE_NOTIFY, 0);
    for (uint32_t spin = 0; spin < SPIN_LIMIT; ++spin) {
        barrier();
        if (*(volatile uint16_t*)&used.idx != before)
            return status;
    }
    return -1;
}

uint32_t guest_main(void)
{
    if (reg(VIRTIO_MMIO_MAGIC_VALUE) != 0x74726976 || reg(VIRTIO_MMIO_VERSION) != 2 ||
        reg(VIRTIO_MMIO_DEVICE_ID) != 2)
        return 1;
    trace(1);
    set(VIRTIO_MMIO_STATUS, 0);
    set(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE);
    set(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER);
    set(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
    if (!(reg(VIRTIO_MMIO_DEVICE_FEATURES) & 1))  /* VIRTIO_F_VERSION_1 is bit 32 */
        return 2;
    set(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
    set(VIRTIO_MMIO_DRIVER_FEATURES, 1);
    set(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
    set(VIRTIO_MMIO_DRIVER_FEATURES, 0);
    const uint32_t features_ok = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK;
    set(VIRTIO_MMIO_STATUS, features_ok);
    if (!(reg(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_FEATURES_OK))
        return 3;
    trace(2);
    set(VIRTIO_MMIO_QUEUE_SEL, 0);
    if (reg(VIRTIO_MMIO_QUEUE_NUM_MAX) < QSIZE)
        return 4;
    set(VIRTIO_MMIO_QUEUE_NUM, QSIZE);
    set(VIRTIO_MMIO_QUEUE_DESC_LOW, (uint32_t)(uint64_t)desc);
    set(VIRTIO_MMIO_QUEUE_DESC_HIGH, 0);
    set(VIRTIO_MMIO_QUEUE_AVAIL_LOW, (uint32_t)(uint64_t)&avail);
    set(VIRTIO_MMIO_QUEUE_AVAIL_HIGH, 0);
    set(VIRTIO_MMIO_QUEUE_USED_LOW, (uint32_t)(uint64_t)&used);
    set(VIRTIO_MMIO_QUEUE_USED_HIGH, 0);
    set(VIRTIO_MMIO_QUEUE_READY, 1);
    set(VIRTIO_MMIO_STATUS, features_ok | VIRTIO_CONFIG_S_DRIVER_OK);
    trace(reg(VIRTIO_MMIO_CONFIG));  /* capacity in sectors, low half */
    trace(3);

    if (request(VIRTIO_BLK_T_IN, 0, 1) != VIRTIO_BLK_S_OK)
        return 5;
    trace(*(uint32_t*)data);  /* first bytes of sector 0 */
    for (int i = 0; i < 512; ++i)
        data[i] = (uint8_t)(i ^ 0xa5);
    if (request(VIRTIO_BLK_T_OUT, 1, 0) != VIRTIO_BLK_S_OK)
        return 6;
    for (int i = 0; i < 512; ++i)
        data[i] = 0;
    if (request(VIRTIO_BLK_T_IN, 1, 1) != VIRTIO_BLK_S_OK)
        return 7;
    for (int i = 0; i < 512; ++i)
        if (data[i] != (uint8_t)(i ^ 0xa5))
            return 8;
    trace(4);
    /* A read past the end of the disk must fail cleanly with IOERR. */
    if (request(VIRTIO_BLK_T_IN, 0xffffffffull, 1) != VIRTIO_BLK_S_IOERR)
        return 9;
    if (!(reg(VIRTIO_MMIO_INTERRUPT_STATUS) & 1))
        return 10;
    set(VIRTIO_MMIO_INTERRUPT_ACK, 1);
    trace(5);
    return 0;
}
