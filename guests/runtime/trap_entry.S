/*
 * CPU exception entry points (x86_64, CPL 0 only; see traps.c).
 *
 * One 16-byte stub per vector 0-31: vectors without an error code push a 0
 * in its place, so every frame looks the same, then the vector number, and
 * jump to the common part, which calls rt_trap(vector, frame) with frame
 * pointing at the error code (then RIP, CS, RFLAGS, RSP, SS as the CPU
 * pushed them).  rt_trap never returns: a trap ends the guest.
 */
    .section .text, "ax", @progbits

    .globl rt_trap_stubs
    .balign 16
rt_trap_stubs:
    .irp v, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .balign 16
    .if (\v == 8) || (\v == 10) || (\v == 11) || (\v == 12) || (\v == 13) || (\v == 14) || (\v == 17) || (\v == 21) || (\v == 29) || (\v == 30)
    .else
    pushq   $0
    .endif
    pushq   $\v
    jmp     trap_common
    .endr

trap_common:
    cld
    movq    (%rsp), %rdi            /* vector */
    leaq    8(%rsp), %rsi           /* error code, then the CPU's frame */
    andq    $-16, %rsp
    call    rt_trap
1:  jmp     1b

    .section .note.GNU-stack, "", @progbits
