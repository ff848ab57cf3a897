"""Echo profile (python): streams "echo: " and the message, reports a session id, prints the reply."""

import json
import os

message = os.environ["AGENT_MESSAGE"]
previous = os.environ["AGENT_SESSION_ID"]
print("AGENT_PARTIAL:" + json.dumps("echo: "), flush=True)
print("AGENT_PARTIAL:" + json.dumps(message, ensure_ascii=False), flush=True)
print("AGENT_SESSION:" + (previous + "+" if previous else "py-1"))
print("echo: " + message)
