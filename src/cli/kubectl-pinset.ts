#!/usr/bin/env node
// `kubectl pinset ...`: kubectl runs the first executable named
// kubectl-pinset on PATH with the arguments after "pinset" (and its own
// environment, KUBECONFIG included). The people's commands only: the agent
// and the controller are daemons, not kubectl verbs.
import { runAsProgram } from './main.ts';

runAsProgram(process.argv.slice(2), { prog: 'kubectl pinset', exclude: ['agent', 'controller'] });
