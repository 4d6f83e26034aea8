/* Test-only allocation failure for the C tests (alloc_fail.cpp): the Nth C++ allocation
 * (operator new) from now throws std::bad_alloc, once. malloc, and so SQLite, is not
 * affected. */
#ifndef MQTT_INBOX_TESTS_ALLOC_FAIL_H
#define MQTT_INBOX_TESTS_ALLOC_FAIL_H

#ifdef __cplusplus
extern "C" {
#endif

/* Arms the failure: allocation number n (0 = the next one) throws. */
void c_alloc_fail_nth(long n);
/* Disarms it (the count stops). */
void c_alloc_fail_off(void);
/* How many allocations have been failed so far. */
long c_alloc_failures(void);

#ifdef __cplusplus
}
#endif

#endif
