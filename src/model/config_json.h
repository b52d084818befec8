/* config_json.h — internal to src/model: the field readers every family's
 * config.json parser uses (config.c), so one set of rules and messages
 * covers them all: absent or null fields keep their default, wrong types
 * and out-of-range values are errors naming the field ("config: 'x' ...").
 * Pure functions; any thread.
 */
#ifndef MS_MODEL_CONFIG_JSON_H
#define MS_MODEL_CONFIG_JSON_H

#include "base/error.h"
#include "model/config.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct ms_jget {
    const json_t *obj;
    const char *prefix; /* "" or "rope_scaling." ... for messages */
    ms_errbuf *err;
} ms_jget;

const char *ms_json_type_name(const json_t *v);
int ms_jget_int(ms_jget *g, const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out);
int ms_jget_i32(ms_jget *g, const char *key, int def, int lo, int hi, int *out);
int ms_jget_num(ms_jget *g, const char *key, double def, double lo, double hi, float *out);
int ms_jget_bool(ms_jget *g, const char *key, bool def, bool *out);
int ms_jget_str(ms_jget *g, const char *key, const char **out); /* NULL when absent */

/* ms_config_parse over an already decoded object. */
int ms_config_parse_json(ms_config *cfg, const json_t *root, ms_errbuf *err);

#endif
