/*
 * Guest entry point (aarch64, Solo5 hvt ABI).
 *
 * The tender enters here at EL1 with the MMU on, x0 = GPA of struct
 * hvt_boot_info and SP = mem_size - 16 (16-byte aligned).
 */
    .section .text.start, "ax", %progbits
    .globl _start
    .type _start, %function
_start:
    mov     x19, x0                 /* keep the boot info pointer */

    /* Clear .bss ourselves: do not rely on the tender zeroing memory.
     * The linker script makes __bss_start/__bss_end 8-byte aligned. */
    adrp    x1, __bss_start
    add     x1, x1, :lo12:__bss_start
    adrp    x2, __bss_end
    add     x2, x2, :lo12:__bss_end
1:  cmp     x1, x2
    b.hs    2f
    str     xzr, [x1], #8
    b       1b
2:
    mov     x29, xzr                /* end the frame chain */
    mov     x30, xzr
    mov     x0, x19
    bl      rt_init                 /* never returns */
3:  b       3b
    .size _start, . - _start

    .section .note.GNU-stack, "", %progbits
