/*
 * Guest entry point (x86_64, Solo5 hvt ABI).
 *
 * The tender enters here in long mode with RDI = GPA of struct hvt_boot_info
 * and RSP = mem_size - 8.  Only unprivileged instructions are used, so the
 * same code can later run at CPL 3.
 */
    .section .text.start, "ax", @progbits
    .globl _start
    .type _start, @function
_start:
    movq    %rdi, %rbx              /* keep the boot info pointer */

    /* Clear .bss ourselves: do not rely on the tender zeroing memory.
     * The linker script makes __bss_start/__bss_end 8-byte aligned. */
    cld
    leaq    __bss_start(%rip), %rdi
    leaq    __bss_end(%rip), %rcx
    subq    %rdi, %rcx
    shrq    $3, %rcx
    xorl    %eax, %eax
    rep stosq

    /* SysV ABI: RSP is 16-byte aligned before a call; end the frame chain. */
    andq    $-16, %rsp
    xorl    %ebp, %ebp
    movq    %rbx, %rdi
    call    rt_init                 /* never returns */
1:  jmp     1b
    .size _start, . - _start

    .section .note.GNU-stack, "", @progbits
