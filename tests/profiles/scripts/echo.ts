// Echo profile (TypeScript through tsx): the same protocol as echo.js, with types.
const message: string = process.env.AGENT_MESSAGE ?? "";
const previous: string = process.env.AGENT_SESSION_ID ?? "";
const line = (text: string): void => { process.stdout.write(text + "\n"); };
line("AGENT_PARTIAL:" + JSON.stringify("echo: "));
line("AGENT_PARTIAL:" + JSON.stringify(message));
line("AGENT_SESSION:" + (previous ? previous + "+" : "ts-1"));
line("echo: " + message);
