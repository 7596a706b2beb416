"""``python -m pagedcy generate``: complete one prompt with a checkpoint, streaming the text."""
import sys


def main(args, out=None):
    """Stream the completion of ``args.prompt`` to ``out`` (stdout) as tokens arrive.
    Returns 0, or 2 after printing the error for a bad checkpoint or bad options."""
    from pagedcy.engine import LLMEngine, SamplingParams
    out = sys.stdout if out is None else out
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                                stop=args.stop or None)
        engine = LLMEngine(args.model, max_num_seqs=1, num_threads=args.threads,
                           dtype=getattr(args, "dtype", "auto"),
                           quantization=getattr(args, "quantization", None),
                           activation_dtype=getattr(args, "activation_dtype", "auto"))
        engine.add_request("cli", args.prompt, params)
    except (FileNotFoundError, ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    shown = 0
    last = None
    while engine.has_unfinished_requests():
        for res in engine.step():
            last = res.outputs[0]
            if len(last.text) > shown:
                out.write(last.text[shown:])
                out.flush()
                shown = len(last.text)
    out.write("\n")
    out.flush()
    if last is not None and args.verbose:
        print(f"[{len(last.token_ids)} tokens, finish_reason={last.finish_reason}"
              + (f", stop_reason={last.stop_reason!r}" if last.stop_reason is not None else "")
              + "]", file=sys.stderr)
    return 0
