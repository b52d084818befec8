/* finish.h — why a request ended; shared by the scheduler, the engine and the
 * HTTP front end so there is one list. */
#ifndef MS_SERVE_FINISH_H
#define MS_SERVE_FINISH_H

enum ms_finish_kind {
    MS_FINISH_NONE = 0, /* still running */
    MS_FINISH_STOP,     /* EOS or a stop token id, or a stop string */
    MS_FINISH_LENGTH,   /* max_new_tokens reached (or the context filled up) */
    MS_FINISH_ABORT,    /* client gone, /abort_request, stop string, shutdown */
    MS_FINISH_ERROR,    /* engine failure */
};

#endif
