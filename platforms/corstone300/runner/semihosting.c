/*
 * The console and the exit code through Arm semihosting (`bkpt 0xAB` on M-profile), and the
 * newlib system calls on top of it. QEMU serves semihosting with
 * `-semihosting-config enable=on,target=native`; the FVP with `-C cpu0.semihosting-enable=1`.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "board.h"

#define SYS_OPEN 0x01
#define SYS_CLOSE 0x02
#define SYS_WRITE 0x05
#define SYS_READ 0x06
#define SYS_EXIT 0x18
#define SYS_EXIT_EXTENDED 0x20
#define ADP_STOPPED_APPLICATION_EXIT 0x20026

static int semihosting_call(int operation, const void* argument) {
  register int r0 __asm__("r0") = operation;
  register const void* r1 __asm__("r1") = argument;
  __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
  return r0;
}

static int console_handle = -1;

static int console(void) {
  if (console_handle < 0) {
    /* ":tt" opened for writing ("w" is mode 4) is the host's stdout. */
    const uint32_t block[3] = {(uint32_t)":tt", 4, 3};
    console_handle = semihosting_call(SYS_OPEN, block);
  }
  return console_handle;
}

void sh_write(const char* text, size_t length) {
  const uint32_t block[3] = {(uint32_t)console(), (uint32_t)text, (uint32_t)length};
  semihosting_call(SYS_WRITE, block);
}

void sh_print(const char* text) {
  sh_write(text, strlen(text));
}

int sh_open(const char* name, int mode) {
  const uint32_t block[3] = {(uint32_t)name, (uint32_t)mode, (uint32_t)strlen(name)};
  return semihosting_call(SYS_OPEN, block);
}

int sh_close(int handle) {
  const uint32_t block[1] = {(uint32_t)handle};
  return semihosting_call(SYS_CLOSE, block);
}

size_t sh_write_all(int handle, const void* data, size_t length) {
  const uint32_t block[3] = {(uint32_t)handle, (uint32_t)data, (uint32_t)length};
  return (size_t)semihosting_call(SYS_WRITE, block); /* bytes NOT written */
}

size_t sh_read_all(int handle, void* data, size_t length) {
  /* SYS_READ returns the bytes not read; a pipe may deliver a message in pieces. */
  uint8_t* at = (uint8_t*)data;
  while (length > 0) {
    const uint32_t block[3] = {(uint32_t)handle, (uint32_t)at, (uint32_t)length};
    int left = semihosting_call(SYS_READ, block);
    if (left < 0 || (size_t)left > length) {
      return length;
    }
    size_t got = length - (size_t)left;
    if (got == 0) {
      return length; /* end of file */
    }
    at += got;
    length -= got;
  }
  return 0;
}

void sh_exit(int code) {
  /* SYS_EXIT_EXTENDED carries the exit code on 32-bit Arm; SYS_EXIT would only say pass/fail. */
  const uint32_t block[2] = {ADP_STOPPED_APPLICATION_EXIT, (uint32_t)code};
  semihosting_call(SYS_EXIT_EXTENDED, block);
  semihosting_call(SYS_EXIT, (const void*)ADP_STOPPED_APPLICATION_EXIT);
  for (;;) {
  }
}

/* newlib system calls: stdout and stderr go to the console, a heap for printf's number
 * formatting, nothing else. */
extern char __heap_start[];
extern char __heap_end[];
static char* heap_top = __heap_start;

void* _sbrk(ptrdiff_t increment) {
  if (increment < 0 || heap_top + increment > __heap_end) {
    errno = ENOMEM;
    return (void*)-1;
  }
  char* previous = heap_top;
  heap_top += increment;
  return previous;
}

int _write(int file, const char* data, int length) {
  if (file != 1 && file != 2) {
    errno = EBADF;
    return -1;
  }
  sh_write(data, (size_t)length);
  return length;
}

int _read(int file, char* data, int length) {
  (void)file;
  (void)data;
  (void)length;
  return 0;
}

int _close(int file) {
  (void)file;
  return -1;
}

int _fstat(int file, struct stat* status) {
  (void)file;
  status->st_mode = S_IFCHR;
  return 0;
}

int _isatty(int file) {
  return file >= 0 && file <= 2;
}

int _lseek(int file, int offset, int whence) {
  (void)file;
  (void)offset;
  (void)whence;
  return 0;
}

int _open(const char* name, int flags, int mode) {
  (void)name;
  (void)flags;
  (void)mode;
  errno = ENOSYS;
  return -1;
}

int _getpid(void) {
  return 1;
}

int _kill(int pid, int signal) {
  (void)pid;
  (void)signal;
  errno = EINVAL;
  return -1;
}

__attribute__((noreturn)) void _exit(int code) {
  sh_exit(code);
}
