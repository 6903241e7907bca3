"""Element-wise neuron layers: ReLU, PReLU, ELU, Sigmoid, TanH, AbsVal, BNLL, Power, Exp, Log, Threshold, Dropout, Clip, Swish."""
