/*
 * The release profile's snprintf: ExecuTorch's method loader formats operator names with
 * snprintf("%s%s%s", ...) (runtime/executor/method.cpp), the only formatting left once logging
 * is off. The C library's would bring its whole printf engine (about 3 KiB); this one handles
 * what the runtime asks of it, %s, %d, %u, %zu and %%, and writes '?' for anything else.
 * Linked with -Wl,--wrap=snprintf, so only calls through the symbol snprintf come here.
 */
#include <stdarg.h>
#include <stddef.h>

static void put(char* out, size_t size, size_t* n, char c) {
  if (*n + 1 < size) {
    out[*n] = c;
  }
  (*n)++;
}

static void put_unsigned(char* out, size_t size, size_t* n, unsigned long value) {
  char digits[20];
  int count = 0;
  do {
    digits[count++] = (char)('0' + value % 10u);
    value /= 10u;
  } while (value != 0u);
  while (count > 0) {
    put(out, size, n, digits[--count]);
  }
}

int __wrap_snprintf(char* out, size_t size, const char* format, ...) {
  va_list args;
  va_start(args, format);
  size_t n = 0;
  for (const char* p = format; *p != '\0'; p++) {
    if (*p != '%') {
      put(out, size, &n, *p);
      continue;
    }
    p++;
    if (*p == 'z') {
      p++;
      put_unsigned(out, size, &n, (unsigned long)va_arg(args, size_t));
    } else if (*p == 's') {
      for (const char* s = va_arg(args, const char*); s != NULL && *s != '\0'; s++) {
        put(out, size, &n, *s);
      }
    } else if (*p == 'd') {
      int value = va_arg(args, int);
      if (value < 0) {
        put(out, size, &n, '-');
        put_unsigned(out, size, &n, 0ul - (unsigned long)value);
      } else {
        put_unsigned(out, size, &n, (unsigned long)value);
      }
    } else if (*p == 'u') {
      put_unsigned(out, size, &n, va_arg(args, unsigned));
    } else if (*p == '%') {
      put(out, size, &n, '%');
    } else if (*p == '\0') {
      break;
    } else {
      put(out, size, &n, '?');
    }
  }
  if (size > 0) {
    out[n < size ? n : size - 1] = '\0';
  }
  va_end(args);
  return (int)n;
}
