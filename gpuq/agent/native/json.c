/* Just enough JSON: a recursive-descent parser into a small tree, and a writer of strings.
 *
 * What it reads was written by Python's json.dumps (spec.json, the agent's commands), so the
 * parser is strict and small. Lone surrogates \udc80-\udcff are turned back into the bytes
 * that Python's surrogateescape made them from (an environment value that was not UTF-8). */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "supervise.h"

#define MAX_DEPTH 32

typedef struct {
    const char *p, *end;
} cursor;

static void *xrealloc(void *ptr, size_t size) {
    void *next = realloc(ptr, size ? size : 1);
    if (next == NULL) abort(); /* nothing sensible is left to do without memory */
    return next;
}

static void skip_space(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int literal(cursor *c, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return 0;
    c->p += n;
    return 1;
}

static int hex4(cursor *c, unsigned *out) {
    unsigned v = 0;
    if (c->end - c->p < 4) return 0;
    for (int i = 0; i < 4; i++) {
        char ch = *c->p++;
        v <<= 4;
        if (ch >= '0' && ch <= '9') v |= (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f') v |= (unsigned)(ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F') v |= (unsigned)(ch - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

static void put_utf8(buf *b, unsigned cp) {
    char out[4];
    size_t n;
    if (cp < 0x80) { out[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { out[0] = (char)(0xC0 | cp >> 6); out[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        out[0] = (char)(0xF0 | cp >> 18); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
    }
    buf_add(b, out, n);
}

static int parse_string(cursor *c, jval *v) {
    buf b = {0};
    c->p++; /* the opening quote */
    while (c->p < c->end && *c->p != '"') {
        unsigned char ch = (unsigned char)*c->p++;
        if (ch < 0x20) goto fail;
        if (ch != '\\') { buf_add(&b, (const char *)&ch, 1); continue; }
        if (c->p >= c->end) goto fail;
        char esc = *c->p++;
        unsigned cp;
        switch (esc) {
        case '"': case '\\': case '/': buf_add(&b, &esc, 1); break;
        case 'b': buf_add(&b, "\b", 1); break;
        case 'f': buf_add(&b, "\f", 1); break;
        case 'n': buf_add(&b, "\n", 1); break;
        case 'r': buf_add(&b, "\r", 1); break;
        case 't': buf_add(&b, "\t", 1); break;
        case 'u':
            if (!hex4(c, &cp)) goto fail;
            if (cp >= 0xD800 && cp < 0xDC00 && c->end - c->p >= 6 && c->p[0] == '\\' && c->p[1] == 'u') {
                cursor look = {c->p + 2, c->end};
                unsigned low;
                if (hex4(&look, &low) && low >= 0xDC00 && low < 0xE000) {
                    c->p = look.p;
                    put_utf8(&b, 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00));
                    break;
                }
            }
            if (cp >= 0xDC80 && cp <= 0xDCFF) { /* surrogateescape: the original byte */
                char raw = (char)(cp - 0xDC00);
                buf_add(&b, &raw, 1);
            } else if (cp >= 0xD800 && cp < 0xE000) {
                put_utf8(&b, 0xFFFD);
            } else {
                put_utf8(&b, cp);
            }
            break;
        default: goto fail;
        }
    }
    if (c->p >= c->end) goto fail;
    c->p++;
    buf_add(&b, "", 1);
    v->type = J_STR;
    v->str = b.data;
    v->len = b.len - 1;
    return 1;
fail:
    free(b.data);
    return 0;
}

static int parse_value(cursor *c, jval *v, int depth);

static int parse_container(cursor *c, jval *v, int depth, int object) {
    size_t cap = 0;
    char close = object ? '}' : ']';
    v->type = object ? J_OBJ : J_ARR;
    c->p++;
    skip_space(c);
    if (c->p < c->end && *c->p == close) { c->p++; return 1; }
    for (;;) {
        if (v->n == cap) {
            cap = cap ? cap * 2 : 8;
            v->items = xrealloc(v->items, cap * sizeof *v->items);
            if (object) v->keys = xrealloc(v->keys, cap * sizeof *v->keys);
        }
        jval *item = &v->items[v->n];
        memset(item, 0, sizeof *item);
        skip_space(c);
        if (object) {
            jval key = {0};
            if (c->p >= c->end || *c->p != '"' || !parse_string(c, &key)) return 0;
            v->keys[v->n] = key.str;
            skip_space(c);
            if (c->p >= c->end || *c->p++ != ':') { v->n++; return 0; }
        }
        v->n++;
        if (!parse_value(c, item, depth + 1)) return 0;
        skip_space(c);
        if (c->p < c->end && *c->p == ',') { c->p++; continue; }
        if (c->p < c->end && *c->p == close) { c->p++; return 1; }
        return 0;
    }
}

static int parse_value(cursor *c, jval *v, int depth) {
    if (depth > MAX_DEPTH) return 0;
    skip_space(c);
    if (c->p >= c->end) return 0;
    switch (*c->p) {
    case '{': return parse_container(c, v, depth, 1);
    case '[': return parse_container(c, v, depth, 0);
    case '"': return parse_string(c, v);
    case 't': v->type = J_BOOL; v->boolean = 1; return literal(c, "true");
    case 'f': v->type = J_BOOL; v->boolean = 0; return literal(c, "false");
    case 'n': v->type = J_NULL; return literal(c, "null");
    default: {
        char number[64];
        size_t n = 0;
        while (c->p + n < c->end && n < sizeof number - 1 && c->p[n] && strchr("+-0123456789.eE", c->p[n]))
            n++;
        if (n == 0) return 0;
        memcpy(number, c->p, n);
        number[n] = '\0';
        char *stop;
        v->type = J_NUM;
        v->num = strtod(number, &stop);
        if (*stop != '\0') return 0;
        c->p += n;
        return 1;
    }
    }
}

static void free_children(jval *v) {
    for (size_t i = 0; i < v->n; i++) {
        free_children(&v->items[i]);
        if (v->type == J_OBJ) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
}

void json_free(jval *value) {
    if (value == NULL) return;
    free_children(value);
    free(value);
}

jval *json_parse(const char *text, size_t len) {
    cursor c = {text, text + len};
    jval *v = calloc(1, sizeof *v);
    if (v == NULL) abort();
    if (!parse_value(&c, v, 0)) { json_free(v); return NULL; }
    skip_space(&c);
    if (c.p != c.end) { json_free(v); return NULL; }
    return v;
}

const jval *json_get(const jval *object, const char *key) {
    if (object == NULL || object->type != J_OBJ) return NULL;
    for (size_t i = 0; i < object->n; i++)
        if (strcmp(object->keys[i], key) == 0) return &object->items[i];
    return NULL;
}

const char *json_str(const jval *object, const char *key, const char *fallback) {
    const jval *v = json_get(object, key);
    return v != NULL && v->type == J_STR ? v->str : fallback;
}

double json_num(const jval *object, const char *key, double fallback) {
    const jval *v = json_get(object, key);
    return v != NULL && v->type == J_NUM ? v->num : fallback;
}

int json_has_num(const jval *object, const char *key) {
    const jval *v = json_get(object, key);
    return v != NULL && v->type == J_NUM;
}

int json_int(const jval *object, const char *key, long long min, long long max, long long *out) {
    const jval *v = json_get(object, key);
    if (v == NULL || v->type != J_NUM) return 0;
    double num = v->num;
    /* checked before the cast: converting NaN or an out-of-range double is undefined */
    if (!(num >= (double)min && num <= (double)max) || num != trunc(num)) return 0;
    *out = (long long)num;
    return 1;
}

double json_real(const jval *object, const char *key, double min, double max, double fallback) {
    const jval *v = json_get(object, key);
    return v != NULL && v->type == J_NUM && v->num >= min && v->num <= max ? v->num : fallback;
}

int json_cstr(const jval *object, const char *key, const char **out) {
    const jval *v = json_get(object, key);
    if (v == NULL || v->type != J_STR || strlen(v->str) != v->len) return 0;
    *out = v->str;
    return 1;
}

/* ---- writing ---- */

void buf_add(buf *b, const char *data, size_t len) {
    if (b->len + len + 1 > b->cap) {
        b->cap = (b->len + len + 1) * 2;
        b->data = xrealloc(b->data, b->cap);
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
}

void buf_addf(buf *b, const char *format, ...) {
    char small[256];
    va_list args;
    va_start(args, format);
    int n = vsnprintf(small, sizeof small, format, args);
    va_end(args);
    if (n < 0) return;
    if ((size_t)n < sizeof small) { buf_add(b, small, (size_t)n); return; }
    char *big = xrealloc(NULL, (size_t)n + 1);
    va_start(args, format);
    vsnprintf(big, (size_t)n + 1, format, args);
    va_end(args);
    buf_add(b, big, (size_t)n);
    free(big);
}

void buf_consume(buf *b, size_t count) {
    if (count >= b->len) { b->len = 0; if (b->data) b->data[0] = '\0'; return; }
    memmove(b->data, b->data + count, b->len - count);
    b->len -= count;
    b->data[b->len] = '\0';
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 when invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    size_t need;
    unsigned cp;
    if (s[0] < 0x80) return 1;
    if (s[0] >= 0xC2 && s[0] <= 0xDF) { need = 2; cp = s[0] & 0x1F; }
    else if (s[0] >= 0xE0 && s[0] <= 0xEF) { need = 3; cp = s[0] & 0x0F; }
    else if (s[0] >= 0xF0 && s[0] <= 0xF4) { need = 4; cp = s[0] & 0x07; }
    else return 0;
    if (n < need) return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if ((need == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) || (need == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return need;
}

void buf_str(buf *b, const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    size_t n = strlen(text);
    buf_add(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char ch = s[i];
        if (ch == '"' || ch == '\\') { char esc[2] = {'\\', (char)ch}; buf_add(b, esc, 2); i++; }
        else if (ch < 0x20) { buf_addf(b, "\\u%04x", ch); i++; }
        else if (ch < 0x80) { buf_add(b, (const char *)&s[i], 1); i++; }
        else {
            size_t len = utf8_len(&s[i], n - i);
            if (len == 0) { buf_add(b, "\\ufffd", 6); i++; }
            else { buf_add(b, (const char *)&s[i], len); i += len; }
        }
    }
    buf_add(b, "\"", 1);
}
