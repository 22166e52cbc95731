/*
 * C99 length modifiers for ExecuTorch's log messages.
 *
 * Debian's newlib for arm-none-eabi is built without C99 I/O formats: `%zu` prints "zu" and
 * misaligns every argument after it, and ExecuTorch's ET_LOG messages use `%zu` throughout
 * (runtime/platform/log.cpp formats them with vsnprintf). The firmware links with
 * `-Wl,--wrap=vsnprintf`; this wrapper rewrites the modifiers newlib lacks into ones of the same
 * size on this ABI (size_t and ptrdiff_t are 32-bit like long; intmax_t is long long) and hands the
 * format to newlib.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

_Static_assert(sizeof(size_t) == sizeof(long), "z is rewritten as l");
_Static_assert(sizeof(ptrdiff_t) == sizeof(long), "t is rewritten as l");
_Static_assert(sizeof(intmax_t) == sizeof(long long), "j is rewritten as ll");

int __real_vsnprintf(char* buffer, size_t size, const char* format, va_list args);

int __wrap_vsnprintf(char* buffer, size_t size, const char* format, va_list args) {
  char rewritten[320];
  size_t out = 0;
  const char* in = format;
  while (*in != '\0') {
    if (out + 3 >= sizeof(rewritten)) {
      return __real_vsnprintf(buffer, size, format, args); /* too long to rewrite: as is */
    }
    char c = *in++;
    rewritten[out++] = c;
    if (c != '%') {
      continue;
    }
    if (*in == '%') { /* a literal percent sign */
      rewritten[out++] = *in++;
      continue;
    }
    /* flags, width, precision */
    while (*in != '\0' && strchr("-+ #0123456789.*", *in) != NULL && out + 3 < sizeof(rewritten)) {
      rewritten[out++] = *in++;
    }
    if (*in == 'z' || *in == 't') {
      rewritten[out++] = 'l';
      in++;
    } else if (*in == 'j') {
      rewritten[out++] = 'l';
      rewritten[out++] = 'l';
      in++;
    }
  }
  rewritten[out] = '\0';
  return __real_vsnprintf(buffer, size, rewritten, args);
}
