/*
 * step.c — zt_step(): gradient norm and overflow check, loss scaling,
 * clipping, and the update through the optimizer states' tier (its ops
 * table, offload/tier.h: tier_device.c, tier_host.c, tier_nvme.c).
 *
 * Every tier computes the norm on the gradients where they live and applies the
 * same zt_adam_update to the same inputs, so they give identical bits.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/abi.h" // defines: zt__abi_size, ZT__STEP_ARGS_SIZE_0_1
#include "engine/engine.h"
#include "engine/in_place.h" // defines: zt__in_place_give_back_units
#include "zero/agree.h" // defines: zt__agree_sum_ranks
#include "zero/gather.h" // defines: zt__gather_shards, zt__gather_walk_t
#include "zero/reduce.h" // defines: zt__reduce_all, zt__reduce_sumsq, zt__reduce_reset

/* Finite and in [lo, hi) or [lo, hi]: the step's hyper-parameter checks. */
static int bad_float(zt__err_t *e, const char *name, float x, const char *expected) {
  return zt__errf(e, -EINVAL, "args->%s is %g; expected %s", name, (double)x, expected);
}

/* Checks the step's arguments. The caller's args and info may be of an
 * older or newer ztier.h (abi.h): *full gets the args as this library's
 * whole struct (the defaults for what an older one lacks), and *info_have
 * the bytes of info the step may write. */
static int check_args(zt_engine_t *eng, const zt_step_args_t *user, const zt_step_info_t *info,
                      zt_step_args_t *full, size_t *info_have) {
  zt__err_t *e = &eng->err;
  if (user == NULL) return zt__errf(e, -EINVAL, "args is NULL; expected ZT_STEP_ARGS_INIT");
  size_t have;
  ZT_TRY(zt__abi_size(e, "zt_step", "args", "zt_step_args_t", user, user->size,
                      ZT__STEP_ARGS_SIZE_0_1, sizeof(zt_step_args_t), "ZT_STEP_ARGS_INIT",
                      &have));
  static const zt_step_args_t defaults = ZT_STEP_ARGS_INIT;
  *full = defaults;
  memcpy(full, user, have);
  full->size = sizeof *full;
  const zt_step_args_t *a = full;
  if (!isfinite(a->lr) || a->lr < 0) return bad_float(e, "lr", a->lr, "a finite value >= 0");
  if (!isfinite(a->beta1) || a->beta1 < 0 || a->beta1 >= 1)
    return bad_float(e, "beta1", a->beta1, "a value in [0, 1)");
  if (!isfinite(a->beta2) || a->beta2 < 0 || a->beta2 >= 1)
    return bad_float(e, "beta2", a->beta2, "a value in [0, 1)");
  if (!isfinite(a->eps) || a->eps <= 0) return bad_float(e, "eps", a->eps, "a finite value > 0");
  if (!isfinite(a->weight_decay) || a->weight_decay < 0)
    return bad_float(e, "weight_decay", a->weight_decay, "a finite value >= 0");
  if (a->t == 0)
    return zt__errf(e, -EINVAL, "args->t is 0; expected the 1-based step number (t >= 1), "
                                "as bias correction divides by 1 - beta^t");
  if (!isfinite(a->grad_scale) || a->grad_scale <= 0)
    return bad_float(e, "grad_scale", a->grad_scale, "a finite value > 0 (1 for none)");
  if (!isfinite(a->clip_grad_norm))
    return bad_float(e, "clip_grad_norm", a->clip_grad_norm,
                     "a finite value: > 0 to clip, 0 for none, < 0 for the config's");
  *info_have = 0;
  if (info)
    ZT_TRY(zt__abi_size(e, "zt_step", "info", "zt_step_info_t", info, info->size,
                        ZT__STEP_INFO_SIZE_0_1, sizeof(zt_step_info_t), "ZT_STEP_INFO_INIT",
                        info_have));
  return 0;
}


/* Sum of squares of the gradients, summed over ranks in rank order, and the
 * factor that turns the gradients it was taken on into the average
 * gradient: 1 unpartitioned, 1/W for the sums of W ranks of a shard. At
 * stages 1 and 2 the gradients are reduced to their owners first.
 *
 * `local` is this rank's own refusal of the call (0, or a code whose sentence
 * is already written). Partitioned, the ranks are then in collectives
 * together: a rank that refuses still makes the same exchanges (the
 * reduction, then the vote before the sum), with its refusal and whether
 * it handed out the current loss scale in that vote, so that
 * every rank refuses alike instead of some waiting for a rank that left.
 * *refused gets the code of such a refusal (the reduction stands: a retry
 * finds the gradients handed over, as after zt_grad_norm). The return value
 * is a failure of the exchanges themselves, which leaves buckets half
 * reduced. `args` (zt_step's, NULL otherwise) are compared between the
 * ranks before anything moves: a difference is a refusal on every rank. */
static int grad_sumsq(zt_engine_t *eng, const char *fn, int local, const zt_step_args_t *args,
                      double *out, double *avg, int *refused) {
  double t0 = zt__now();
  *refused = 0;
  if (eng->partitioned) {
    zt__part_t *p = &eng->zero.part;
    int rc = zt__reduce_all(p, local ? NULL : args);
    if (rc < 0 && p->disagreed == ZT_REFUSED_ALIKE) {
      p->disagreed = 0;
      *refused = rc; /* every rank's, and nothing moved */
      return 0;
    }
    ZT_TRY(rc);
    *out = 0.0;
    if (p->on_device && p->norm_dev == NULL)
      ZT_TRY(eng->be_ops->sumsq(eng->be, p->grads, p->begin, p->sums_dtype, p->segs,
                                p->n_segs, ZT_STREAM_COMPUTE, out));
    else
      ZT_TRY(zt__reduce_sumsq(p, out));
    /* The loss scale is the same on every rank (the scaler moves on the
     * all-gathered sum), so "handed out the current one" is comparable; a
     * rank that did not would unscale by another value than its peers. */
    int handed = eng->scaler.handed == eng->scaler.scale;
    int bad_rank, bad_code, flag_rank;
    ZT_TRY(zt__agree_sum_ranks(p, out, local, handed, &bad_rank, &bad_code, &flag_rank));
    *avg = 1.0 / p->world;
    if (local) {
      *refused = local; /* this rank's own sentence stands */
    } else if (bad_rank >= 0) {
      *refused = zt__errf(&eng->err, bad_code,
                          "%s: rank %d refused the call (%s; its sentence is on that rank), "
                          "so every rank refuses it rather than wait in a collective that "
                          "rank left",
                          fn, bad_rank, zt_err_name(bad_code));
    } else if (flag_rank >= 0) {
      *refused = zt__errf(
          &eng->err, -EINVAL,
          "%s: zt_loss_scale() handed out the current loss scale (%g) on some ranks and "
          "not on others (rank 0 and rank %d differ; this rank %s); their gradients would "
          "be unscaled differently: call zt_loss_scale() on every rank before the "
          "backward, or on none",
          fn, eng->scaler.scale, flag_rank, handed ? "asked for it" : "did not");
    }
  } else {
    if (local) {
      *refused = local; /* no peers to tell: the engine is not partitioned */
      return 0;
    }
    ZT_TRY(eng->be_ops->sumsq(eng->be, eng->grads, 0, eng->grad_dtype, eng->segs,
                              eng->n_segs, ZT_STREAM_COMPUTE, out));
    *avg = 1.0;
  }
  eng->norm_seconds += zt__now() - t0;
  return 0;
}

int zt_grad_norm(zt_engine_t *eng, float grad_scale, double *norm) {
  ZT_TRY(zt__engine_check(eng, "zt_grad_norm"));
  int local = 0;
  if (norm == NULL)
    local = zt__errf(&eng->err, -EINVAL, "norm is NULL; expected a double *");
  else if (!isfinite(grad_scale) || grad_scale <= 0)
    local = zt__errf(&eng->err, -EINVAL, "grad_scale is %g; expected a finite value > 0",
                     (double)grad_scale);
  double sumsq = 0.0, avg = 1.0;
  int refused;
  int rc = grad_sumsq(eng, "zt_grad_norm", local, NULL, &sumsq, &avg, &refused);
  if (rc < 0) {
    if (!eng->partitioned) return rc;
    return zt__engine_fail(eng, rc); /* broken: buckets may be half reduced */
  }
  if (refused) return refused;
  *norm = sqrt(sumsq) * ((double)grad_scale / eng->scaler.handed) * avg;
  return 0;
}

/* ---- the update of a shard ---------------------------------------------------- */

/* Stages 1 to 3: the update of this rank's shard, in its tier, and (stages
 * 1, 2) every rank's updated parameters back into every rank's buffer.
 * With the shard's parameters on the parameter tier's own medium between
 * steps (on_medium), an optimizer tier that sends its parameters there
 * itself (params_sink, the nvme tier's windows) updates alone; the others
 * update them in a fresh buffer of the room's, which is put to the tier and
 * freed after. The tier's done makes the puts durable (memory tiers: 0). */
static int update_shard(zt_engine_t *eng, const zt__adam_hp_t *hp) {
  zt__part_t *p = &eng->zero.part;
  zt__opt_tier_t *t = &eng->opt;
  zt__param_tier_t *pt = &eng->ptier;
  int fresh = pt->on_medium && t->view.params_sink == NULL;
  if (fresh) {
    ZT_TRY(zt__part_params_alloc(p));
    t->view.params = p->params; /* a fresh buffer each step */
  }
  /* Stages 1 and 2, with a tier that updates the shard on the CPU where it
   * is: the gather follows the update (gather.h), so that each bucket's
   * collective and copy to the device overlap the update of the next. */
  int follow = eng->cfg.stage < 3 && t->ops->cpu_update && t->shard;
  zt__gather_walk_t walk;
  if (follow) {
    ZT_TRY(zt__gather_shards_begin(p, &walk));
    t->progress = (zt__update_progress_t){zt__gather_shards_upto, &walk, p->bucket_elems};
  }
  int rc = t->ops->update(t, hp, NULL);
  t->progress = (zt__update_progress_t){0};
  if (rc == 0) rc = zt__part_updated(p);
  if (rc == 0 && pt->on_medium) rc = zt__part_update_wait(p); /* the put reads them */
  if (rc == 0 && fresh) rc = pt->ops->put(pt, p->begin, p->end, p->params);
  int done = pt->ops->done(pt);
  if (pt->on_medium) zt__part_params_free(p);
  ZT_TRY(rc < 0 ? rc : done);
  double t1 = zt__now();
  /* Stage 3 gathers when a group is fetched, not after the step. */
  if (follow) ZT_TRY(zt__gather_shards_end(&walk));
  else if (eng->cfg.stage < 3 && !p->params_in_place) ZT_TRY(zt__gather_shards(p));
  eng->copy_seconds += zt__now() - t1 + (follow ? walk.wait_seconds : 0.0);
  return 0;
}

/* ---- the step ----------------------------------------------------------------- */

static double step_clip(const zt_engine_t *eng, const zt_step_args_t *args) {
  return args->clip_grad_norm >= 0 ? (double)args->clip_grad_norm : eng->cfg.clip_grad_norm;
}

/* Whether a step with inf/nan gradients is skipped: with "nonfinite"
 * "skip", and with loss scaling on, where they are an overflow of the scale
 * (the scaler backs off). "apply" applies them otherwise, as
 * torch.optim.AdamW does. The same on every rank, at every stage. */
static int skips_nonfinite(const zt_engine_t *eng) {
  return eng->cfg.nonfinite == ZT_NONFINITE_SKIP || eng->scaler.scaled;
}

/* Whether the step reads the gradients once: nothing needs their norm before
 * the update (no skip, no clipping, no ranks to agree with first) and the
 * tier's update can take it in its own pass. */
static int fuses_norm(const zt_engine_t *eng, const zt_step_args_t *args) {
  return !eng->partitioned && !skips_nonfinite(eng) && step_clip(eng, args) <= 0 &&
         zt__opt_tier_fuses_norm(&eng->opt);
}

/* The step's constants, the gradients multiplied by `gmul`. */
static void step_hp(const zt_engine_t *eng, const zt_step_args_t *args, double gmul,
                    zt__adam_hp_t *hp) {
  zt__adam_hp_make(args, gmul, eng->cfg.optimizer == ZT_ADAM_L2 ? ZT_MODE_ADAM_L2 : ZT_MODE_ADAMW,
                   eng->cfg.rounding == ZT_ROUND_STOCHASTIC && eng->param_dtype == ZT_BF16,
                   zt_sr_key(eng->cfg.seed, args->t), hp);
}

static void applied_nonfinite(zt_engine_t *eng, const zt_step_args_t *args) {
  zt__log(&eng->cfg, ZT_LOG_WARN,
          "step t=%llu applied inf/nan gradients (\"nonfinite\" is \"apply\"): the "
          "elements they reach are no longer finite",
          (unsigned long long)args->t);
}

/* The end of every step that returns 0, applied, skipped or fused: the
 * iteration's bookkeeping, and the caller's info. */
static int finish_step(zt_engine_t *eng, zt_step_info_t *info, zt_step_info_t *user_info,
                       size_t info_have, double t0) {
  if (eng->partitioned) {
    int rc = zt__reduce_reset(&eng->zero.part);
    /* The update is in, but the gradients it read are not zeroed, nor the
     * next sums ordered after it. */
    if (rc < 0) return zt__engine_fail(eng, rc);
  }
  eng->fetches_since_step = 0;
  /* The iteration ends here, skipped or not: the next one is read ahead. */
  if (eng->partitioned && eng->cfg.stage >= 3) {
    int rc = zt__prefetch_step_end(&eng->zero.prefetch);
    if (rc < 0) return zt__engine_fail(eng, rc);
  }
  if (info) {
    info->loss_scale = eng->scaler.scale;
    info->size = user_info->size;
    memcpy(user_info, info, info_have);
  }
  eng->step_seconds += zt__now() - t0;
  return 0;
}

/* A step that reads the gradients once (fuses_norm): the update takes their
 * sum of squares on its way, the sum a separate pass gives, to the bit.
 * The update's inputs do not depend on it: no clipping, no loss scale. */
static int fused_step(zt_engine_t *eng, const zt_step_args_t *args, zt_step_info_t *info,
                      zt_step_info_t *user_info, size_t info_have) {
  double t0 = zt__now();
  double inv = (double)args->grad_scale / eng->scaler.handed;
  zt__adam_hp_t hp;
  step_hp(eng, args, inv, &hp);
  double sumsq = 0.0;
  int rc = eng->opt.ops->update(&eng->opt, &hp, &sumsq);
  if (rc < 0) return zt__engine_fail(eng, rc); /* some states updated, others not */
  if (!isfinite(sumsq)) applied_nonfinite(eng, args);
  eng->steps++;
  if (info) {
    info->grad_norm = sqrt(sumsq) * inv;
    info->clip_coef = 1.0;
    info->skipped = 0;
  }
  return finish_step(eng, info, user_info, info_have, t0);
}

static void scaler_update(zt__scaler_t *s, const zt_config_t *c, int overflow) {
  if (!s->dynamic) return;
  if (overflow) {
    s->scale = fmax(s->scale * c->loss_scale_backoff, c->min_loss_scale);
    s->good_steps = 0;
  } else if (++s->good_steps >= c->loss_scale_window) {
    s->scale *= c->loss_scale_growth;
    s->good_steps = 0;
  }
}

int zt_step(zt_engine_t *eng, const zt_step_args_t *args, zt_step_info_t *info) {
  ZT_TRY(zt__engine_check(eng, "zt_step"));
  /* A refusal here is this rank's alone; grad_sumsq makes every rank refuse
   * with it (partitioned ranks are in collectives together). */
  zt_step_args_t args_full;
  zt_step_info_t info_full = {0}, *user_info = info;
  size_t info_have = 0;
  int local = check_args(eng, args, info, &args_full, &info_have);
  if (local == 0) args = &args_full;
  /* The step fills a whole info of this library's, and hands the caller its
   * first info_have bytes when it succeeds. */
  if (info) info = &info_full;
  if (local == 0 && eng->partitioned && eng->cfg.stage >= 3)
    for (size_t g = 0; g < eng->zero.part.n_groups; g++)
      if (eng->zero.part.groups[g].fetched) {
        local = zt__errf(&eng->err, -EBUSY,
                         "zt_step: group %d is still fetched; zt_release() every group "
                         "before the step (its gathered parameters would be stale)",
                         eng->zero.part.groups[g].id);
        break;
      }
  if (local == 0 && eng->partitioned && eng->cfg.stage >= 3 && eng->fetches_since_step == 0)
    local = zt__errf(&eng->err, -EINVAL,
                     "zt_step: stage 3 and no group was fetched since %s; at stage 3 the "
                     "engine holds the parameters and updates only its shards, so a loop "
                     "that reads its own buffer trains weights that never change. Bracket "
                     "each group's use with zt_fetch()/zt_release() and call "
                     "zt_grads_ready() as its gradients finish (docs/stages.md), or set "
                     "\"stage\" to 0, 1 or 2, which update the registered buffer in place",
                     eng->steps + eng->skipped_steps ? "the last step" : "registration");
  if (local == 0 && fuses_norm(eng, args))
    return fused_step(eng, args, info, user_info, info_have);
  double t0 = zt__now();

  double sumsq = 0.0, avg = 1.0;
  int refused;
  int rc = grad_sumsq(eng, "zt_step", local, args, &sumsq, &avg, &refused);
  if (rc < 0) {
    if (!eng->partitioned) return rc;
    return zt__engine_fail(eng, rc);
  }
  if (refused) return refused;
  /* Stage 3 in place: every group is handed over now, so the units'
   * registered gradients read as zero; their pages go back (in_place.h). */
  if (eng->place_grads)
    zt__in_place_give_back_units(eng, -1, eng->place_grads, zt__dtype_size(eng->grad_dtype), 1);
  double inv = (double)args->grad_scale / eng->scaler.handed * avg;
  double norm = sqrt(sumsq) * inv;
  int nonfinite = !isfinite(sumsq);
  int overflow = nonfinite && skips_nonfinite(eng);
  double clip = step_clip(eng, args);
  /* torch.nn.utils.clip_grad_norm_'s coefficient, eps included. */
  double coef = (!nonfinite && clip > 0 && norm > clip) ? clip / (norm + 1e-6) : 1.0;

  if (info) {
    info->grad_norm = norm;
    info->clip_coef = coef;
    info->skipped = overflow;
  }
  if (nonfinite && !overflow) applied_nonfinite(eng, args);
  if (overflow) {
    /* Nothing is read past this point and nothing is written: the step is
     * skipped on every rank alike (the sum of squares was all-reduced). */
    scaler_update(&eng->scaler, &eng->cfg, 1);
    eng->skipped_steps++;
    zt__log(&eng->cfg, ZT_LOG_INFO, "step t=%llu skipped: inf/nan in the gradients; loss "
                                    "scale now %g",
            (unsigned long long)args->t, eng->scaler.scale);
  } else {
    zt__adam_hp_t hp;
    /* Reads ahead and kept groups hold parameters the update changes. */
    if (eng->partitioned && eng->cfg.stage >= 3) zt__prefetch_step_begin(&eng->zero.prefetch);
    step_hp(eng, args, inv * coef, &hp);
    rc = eng->partitioned ? update_shard(eng, &hp) : eng->opt.ops->update(&eng->opt, &hp, NULL);
    if (rc < 0) {
      /* Some states may be updated and others not: refuse to go on from a
       * state that no step produced. The peers, past the same vote, are
       * told rather than left waiting in the gather. */
      return zt__engine_fail(eng, rc);
    }
    scaler_update(&eng->scaler, &eng->cfg, 0);
    eng->steps++;
  }
  return finish_step(eng, info, user_info, info_have, t0);
}
