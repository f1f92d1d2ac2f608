/*
 * Compile-time checks for the headers cffi reads: cffi cannot parse an
 * array size written as a constant's name, so those headers size their
 * arrays with literals, and the .c file that includes each header checks
 * every such literal against its named constant with this macro.
 * Not read by cffi.
 */
#ifndef PYVMM_STATIC_CHECK_H
#define PYVMM_STATIC_CHECK_H

#define PYVMM_ARRAY_LEN_IS(type, field, n)                                         \
    _Static_assert(sizeof(((type *)0)->field) / sizeof(((type *)0)->field[0]) == (n), \
                   #type "." #field " must have " #n " elements")

#endif
