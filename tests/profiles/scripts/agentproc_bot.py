"""A profile written with the AgentProc SDK (PyPI ``agentproc==0.4.2``) the way its users write
them: one async handler, streaming with ``send_partial``, a session id in ``AgentResult``."""

from agentproc import AgentResult, ProtocolError, create_profile


async def handler(ctx):
    if ctx.message == "fail":
        raise ProtocolError("the model refused")
    if ctx.message == "crash":
        raise RuntimeError("kaboom")
    for chunk in ("Hel", "lo ", "wörld\n", "✓"):
        await ctx.send_partial(chunk)
    session = ctx.session_id + "+" if ctx.session_id else "ap-1"
    return AgentResult(response=f"final body from {ctx.from_user} in {ctx.session_name}", session_id=session)


create_profile(handler)
