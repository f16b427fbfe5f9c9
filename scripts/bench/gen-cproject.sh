#!/usr/bin/env bash
# gen-cproject.sh DIR NFILES — write a deterministic C project (NFILES modules + main.c,
# one shared header, a Makefile with -MMD dependency files) into DIR. Used by bench.sh.
set -euo pipefail
dir=$1
n=$2
mkdir -p "$dir/src" "$dir/include"

cat >"$dir/include/common.h" <<'EOF'
#ifndef COMMON_H
#define COMMON_H
#include <stddef.h>
#include <stdint.h>
#define ROTL32(x, r) (((x) << (r)) | ((x) >> (32 - (r))))
typedef struct { uint32_t a, b, c, d; } state_t;
static inline uint32_t step(state_t *s) {
    uint32_t t = s->b << 9, r = ROTL32(s->a * 5, 7) * 9;
    s->c ^= s->a; s->d ^= s->b; s->b ^= s->c; s->a ^= s->d; s->c ^= t; s->d = ROTL32(s->d, 11);
    return r;
}
#endif
EOF

for ((m = 0; m < n; m++)); do
    f=$(printf '%s/src/mod_%03d.c' "$dir" "$m")
    {
        printf '#include "common.h"\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\n'
        for ((k = 0; k < 10; k++)); do
            printf 'static uint32_t f%d_%d(uint32_t x, const uint32_t *tab, size_t len) {\n' "$m" "$k"
            printf '    state_t s = { x, x ^ %du, x + %du, ~x };\n' $((m * 131 + k)) $((k * 977 + 3))
            printf '    uint32_t acc = 0;\n'
            printf '    for (size_t i = 0; i < len; i++) {\n'
            printf '        acc += step(&s) ^ tab[(i * %d) %% len];\n' $((k + 3))
            printf '        if ((acc & %du) == %du) acc = ROTL32(acc, %d);\n' $((k | 7)) $((k & 7)) $((k % 31 + 1))
            printf '        switch (acc %% 4) { case 0: acc *= %du; break; case 1: acc ^= %du; break;\n' $((2 * k + 3)) $((m * 7 + k))
            printf '        case 2: acc += s.c >> %d; break; default: acc -= s.d << %d; }\n' $((k % 13 + 1)) $((k % 5 + 1))
            printf '    }\n    return acc;\n}\n\n'
        done
        printf 'uint32_t mod_%d(uint32_t seed) {\n    uint32_t tab[64];\n' "$m"
        printf '    for (int i = 0; i < 64; i++) tab[i] = seed * (uint32_t)(i + %d);\n' "$m"
        printf '    uint32_t acc = seed;\n'
        for ((k = 0; k < 10; k++)); do
            printf '    acc ^= f%d_%d(acc, tab, 64);\n' "$m" "$k"
        done
        printf '    return acc;\n}\n'
    } >"$f"
done

{
    printf '#include <stdio.h>\n#include <stdint.h>\n\n'
    for ((m = 0; m < n; m++)); do printf 'uint32_t mod_%d(uint32_t);\n' "$m"; done
    printf '\nint main(void) {\n    uint32_t acc = 1;\n'
    for ((m = 0; m < n; m++)); do printf '    acc = mod_%d(acc);\n' "$m"; done
    printf '    printf("built ok %%u\\n", acc);\n    return 0;\n}\n'
} >"$dir/src/main.c"

cat >"$dir/Makefile" <<'EOF'
CC ?= gcc
CFLAGS = -O2 -Wall -MMD -MP -Iinclude
SRCS = $(sort $(wildcard src/*.c))
OBJS = $(SRCS:src/%.c=obj/%.o)

app: $(OBJS)
	$(CC) -o $@ $(OBJS)

obj/%.o: src/%.c | obj
	$(CC) $(CFLAGS) -c -o $@ $<

obj:
	mkdir -p obj

clean:
	rm -rf obj app

-include $(OBJS:.o=.d)
EOF
