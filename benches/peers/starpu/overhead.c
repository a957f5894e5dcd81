/* StarPU's per-task runtime overhead on empty codelets, in the dependency shapes of
 * `tandem bench overhead`: a chain (task i depends on task i-1) and independent tasks.
 *
 *   overhead TASKS REPEATS SCHED...     e.g. overhead 100000 5 eager lws ws dmda prio
 *
 * For each scheduler: starpu_init with it (CPU workers only), one untimed run per shape, then
 * REPEATS timed runs; the median per task is printed as one CSV line per scheduler and shape:
 *   sched,shape,tasks,create_us,execute_us,total_us
 * create = starpu_task_create + dependency declaration (tandem's counterpart is its plan),
 * execute = submission of every task + starpu_task_wait_for_all + destroying the tasks
 * (tandem's: submit, wait, drop the result). Build: see run.sh (pkg-config starpu-1.3). */
#include <starpu.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void empty(void *buffers[], void *arg) {
    (void)buffers;
    (void)arg;
}

static struct starpu_codelet nop_cl = {
    .where = STARPU_CPU,
    .cpu_funcs = {empty},
    .nbuffers = 0,
    .name = "nop",
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One run of `n` tasks; chain != 0: each depends on the one before. */
static int one_run(struct starpu_task **tasks, int n, int chain, double *create, double *exec) {
    double t0 = now();
    for (int i = 0; i < n; i++) {
        struct starpu_task *t = starpu_task_create();
        t->cl = &nop_cl;
        t->destroy = 0;
        if (chain && i > 0)
            starpu_task_declare_deps_array(t, 1, &tasks[i - 1]);
        tasks[i] = t;
    }
    double t1 = now();
    for (int i = 0; i < n; i++) {
        int ret = starpu_task_submit(tasks[i]);
        if (ret != 0) {
            fprintf(stderr, "starpu_task_submit: %s\n", strerror(-ret));
            return -1;
        }
    }
    starpu_task_wait_for_all();
    for (int i = 0; i < n; i++)
        starpu_task_destroy(tasks[i]);
    double t2 = now();
    *create = t1 - t0;
    *exec = t2 - t1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TASKS REPEATS SCHED... (e.g. 100000 5 eager lws ws dmda prio)\n", argv[0]);
        return 2;
    }
    int n = atoi(argv[1]);
    int reps = atoi(argv[2]);
    if (n < 1 || reps < 1) {
        fprintf(stderr, "TASKS and REPEATS must be at least 1 (got '%s', '%s')\n", argv[1], argv[2]);
        return 2;
    }
    struct starpu_task **tasks = calloc((size_t)n, sizeof *tasks);
    double *c = calloc((size_t)reps, sizeof *c), *e = calloc((size_t)reps, sizeof *e),
           *s = calloc((size_t)reps, sizeof *s);
    if (!tasks || !c || !e || !s) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    printf("sched,shape,tasks,create_us,execute_us,total_us\n");
    for (int a = 3; a < argc; a++) {
        struct starpu_conf conf;
        starpu_conf_init(&conf);
        conf.sched_policy_name = argv[a];
        conf.ncuda = 0;
        conf.nopencl = 0;
        int ret = starpu_init(&conf);
        if (ret != 0) {
            fprintf(stderr, "starpu_init with scheduler %s: %s\n", argv[a], strerror(-ret));
            return 1;
        }
        for (int chain = 1; chain >= 0; chain--) {
            double cc, ee;
            if (one_run(tasks, n, chain, &cc, &ee) != 0) /* warm-up */
                return 1;
            for (int r = 0; r < reps; r++) {
                if (one_run(tasks, n, chain, &c[r], &e[r]) != 0)
                    return 1;
                s[r] = c[r] + e[r];
            }
            qsort(c, (size_t)reps, sizeof *c, cmp);
            qsort(e, (size_t)reps, sizeof *e, cmp);
            qsort(s, (size_t)reps, sizeof *s, cmp);
            printf("%s,%s,%d,%.3f,%.3f,%.3f\n", argv[a], chain ? "chain" : "independent", n,
                   1e6 * c[reps / 2] / n, 1e6 * e[reps / 2] / n, 1e6 * s[reps / 2] / n);
            fflush(stdout);
        }
        starpu_shutdown();
    }
    free(tasks);
    free(c);
    free(e);
    free(s);
    return 0;
}
