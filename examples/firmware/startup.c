/* startup.c - the bare-metal start of the kvidx firmware (Cortex-M4 on
 * qemu-system-arm -M mps2-an386): a vector table, a reset handler that sets
 * up .data and .bss and calls main, and the exit through Arm semihosting
 * (SYS_EXIT: qemu ends with status 0 for "application exit", 1 otherwise).
 * No C library start files, no heap, no stdio. */
#include <stdint.h>
#include <string.h>

int main(void);
void kvidx_fw_reset(void);
extern uint32_t __data_load[], __data_start[], __data_end[], __bss_start[], __bss_end[],
    __stack_limit[], __stack_top[];

#define FW_PAINT 0x6b766978u /* an unused stack word keeps this pattern */

static void fw_write0(const char *s) {
  register int r0 __asm__("r0") = 0x04; /* SYS_WRITE0 */
  register const char *r1 __asm__("r1") = s;
  __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
}

static void fw_exit(int status) {
  register int r0 __asm__("r0") = 0x18;                     /* SYS_EXIT */
  register int r1 __asm__("r1") = status ? 0x20023 : 0x20026; /* RunTimeError / ApplicationExit */
  __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
  for (;;) {
  }
}

static void fw_fault(void) { fw_exit(1); } /* any fault ends the run as a failure */

__attribute__((section(".vectors"), used)) static void (*const vectors[16])(void) = {
    (void (*)(void))(uintptr_t)__stack_top, /* initial stack pointer */
    kvidx_fw_reset, fw_fault, fw_fault, fw_fault, fw_fault, fw_fault, 0, 0, 0, 0,
    fw_fault, fw_fault, 0, fw_fault, fw_fault};

/* Measured stack use (high-water mark of the painted stack), printed after
 * main as a cross-check of the static bound from stack_depth.py. */
static void fw_report_stack(void) {
  const uint32_t *p = __stack_limit;
  uint32_t used;
  char b[16], *q = b + sizeof b - 1;
  while (p < __stack_top && *p == FW_PAINT) p++;
  used = (uint32_t)((const char *)__stack_top - (const char *)p);
  *q = 0;
  do *--q = (char)('0' + used % 10); while ((used /= 10) != 0);
  fw_write0("firmware: stack high-water mark ");
  fw_write0(q);
  fw_write0(" bytes\n");
}

void kvidx_fw_reset(void) {
  uint32_t *p, *sp;
  int status;
  /* CPACR: full access to the FPU (cp10, cp11) before any code may use it */
  *(volatile uint32_t *)0xE000ED88u |= 0xFu << 20;
  __asm__ volatile("dsb\n\tisb" ::: "memory");
  memcpy(__data_start, __data_load, (size_t)((char *)__data_end - (char *)__data_start));
  memset(__bss_start, 0, (size_t)((char *)__bss_end - (char *)__bss_start));
  __asm__ volatile("mov %0, sp" : "=r"(sp));
  for (p = __stack_limit; p < sp - 16; p++) *p = FW_PAINT; /* below this frame */
  status = main();
  fw_report_stack();
  fw_exit(status);
}
