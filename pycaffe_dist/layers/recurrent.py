"""RNN, LSTM and LSTMUnit."""
