/* Entry of every tiny guest: agentvm starts it in 64-bit mode with paging on and interrupts
 * off. Set a stack below the EBDA, run main, report its value on the result port, then
 * request power-off through the i8042 reset. Nothing here may fault: PVM hosts cannot
 * deliver exceptions to a guest. */
    .section .text.start, "ax"
    .globl _start
_start:
    mov $0x80000, %rsp
    call guest_main
    mov $0x500, %dx
    out %eax, %dx
    mov $0xfe, %al
    out %al, $0x64
1:  hlt
    jmp 1b

    .section .note.GNU-stack, "", @progbits
