// Echo profile (node): streams "echo: " and the message, reports a session id, prints the reply.
const message = process.env.AGENT_MESSAGE;
const previous = process.env.AGENT_SESSION_ID;
process.stdout.write("AGENT_PARTIAL:" + JSON.stringify("echo: ") + "\n");
process.stdout.write("AGENT_PARTIAL:" + JSON.stringify(message) + "\n");
process.stdout.write("AGENT_SESSION:" + (previous ? previous + "+" : "js-1") + "\n");
process.stdout.write("echo: " + message + "\n");
