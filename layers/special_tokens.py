"""The token ids every model reserves. The tokenizers are trained to give them
(`pipeline.data.tokenizer`), and the models' defaults, the search and the exports read them here."""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
